// "adadelta": torch.optim.Adadelta (the step is the gradient scaled by the ratio of the running
// RMS of past updates to the running RMS of gradients, times lr; L2 weight decay added to the
// gradient), over the whole group per call in the order of torch's _multi_tensor_adadelta (in
// cache-sized chunks: common/chunked.hpp). State as torch names it: "step" (0-dim float32 on the
// parameter's device), "square_avg", "acc_delta".
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>

#include <cmath>
#include <memory>
#include <vector>

#include "adaptive/components.hpp"
#include "common/chunked.hpp"
#include "common/multi_tensor.hpp"
#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace kiln::adaptive {
namespace {

using kiln::optim::Param;
using kiln::optim::pick;

struct Adadelta {
  const kiln_host_api* host;
  double rho;
  double eps;
};

void adadelta_update(const Adadelta& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group("adadelta", group);
  const kiln::optim::StateStore state(opt.host, ctx);
  const double lr = group->lr, wd = group->weight_decay;
  // All state first, so that a host failure leaves every parameter untouched.
  const size_t n = params.size();
  std::vector<at::Tensor> square_avgs(n), acc_deltas(n), steps(n);
  for (size_t k = 0; k < n; ++k) {
    const Param& p = params[k];
    square_avgs[k] = state.get(p, "square_avg", KILN_STATE_ZEROS_LIKE_PARAM);
    acc_deltas[k] = state.get(p, "acc_delta", KILN_STATE_ZEROS_LIKE_PARAM);
    steps[k] = state.get(p, "step", KILN_STATE_SCALAR_LIKE_PARAM);
  }
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    kiln::optim::BucketLists b = kiln::optim::bucket_lists(params, bucket);
    std::vector<at::Tensor> bucket_square_avgs = pick(square_avgs, bucket);
    std::vector<at::Tensor> bucket_acc_deltas = pick(acc_deltas, bucket);
    at::_foreach_add_(pick(steps, bucket), 1);
    kiln::optim::sweep_chunks(
        {&b.params, &b.grads, &bucket_square_avgs, &bucket_acc_deltas},
        [&](const std::vector<std::vector<at::Tensor>>& l, const std::vector<size_t>&) {
          const std::vector<at::Tensor>&ps = l[0], &square_avg = l[2], &acc_delta = l[3];
          std::vector<at::Tensor> gs = l[1];
          if (wd != 0.0) gs = at::_foreach_add(gs, ps, wd);
          at::_foreach_mul_(square_avg, opt.rho);
          at::_foreach_addcmul_(square_avg, gs, gs, 1.0 - opt.rho);
          std::vector<at::Tensor> std_ = at::_foreach_add(square_avg, opt.eps);
          at::_foreach_sqrt_(std_);
          // delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g
          std::vector<at::Tensor> deltas = at::_foreach_add(acc_delta, opt.eps);
          at::_foreach_sqrt_(deltas);
          at::_foreach_div_(deltas, std_);
          at::_foreach_mul_(deltas, gs);
          at::_foreach_mul_(acc_delta, opt.rho);
          at::_foreach_addcmul_(acc_delta, deltas, deltas, 1.0 - opt.rho);
          at::_foreach_add_(ps, deltas, -lr);
        });
  }
}

kiln_status* adadelta_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto opt = std::make_unique<Adadelta>();
    opt->host = host;
    opt->rho = kiln_options_float(options, "rho", 0.9);
    opt->eps = kiln_options_float(options, "eps", 1e-6);
    kiln::optim::check_range("adadelta", "rho", opt->rho, 0.0, false, 1.0, false);
    kiln::optim::check_range("adadelta", "eps", opt->eps, 0.0, false, HUGE_VAL, false);
    *out = opt.release();
  });
}

void adadelta_destroy(void* instance) { delete static_cast<Adadelta*>(instance); }

kiln_status* adadelta_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Adadelta& opt = *static_cast<const Adadelta*>(instance);
  return KILN_GUARD(opt.host, { adadelta_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(adadelta_create, adadelta_destroy, adadelta_step);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_RANGE_INIT("rho", KILN_OPT_FLOAT, 0.0, 1.0, "0.9",
                           "decay rate of the running averages (square_avg, acc_delta), in [0, 1]"),
    KILN_OPTION_MIN_INIT("eps", KILN_OPT_FLOAT, 0.0, "1e-6",
                         "term added inside both square roots for numerical stability, >= 0"),
};

const kiln_capabilities kCaps = KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps);

}  // namespace

const kiln_component_descriptor kAdadelta = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "adadelta", KILN_VERSION_INIT(1, 0, 0),
    "Adadelta as torch.optim.Adadelta (lr scales the step; torch's default is 1.0)", &kCaps,
    kOptions, &kVtable);

}  // namespace kiln::adaptive
