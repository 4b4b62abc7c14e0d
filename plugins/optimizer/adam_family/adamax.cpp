// "adamax": torch.optim.Adamax (Adam with the infinity norm: the denominator is the decaying
// maximum of |g| + eps; L2 weight decay added to the gradient), over the whole group per call in
// the order of torch's _multi_tensor_adamax (in cache-sized chunks: common/chunked.hpp). State as
// torch names it: "step" (0-dim float32 on the parameter's device), "exp_avg", "exp_inf".
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_abs.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_maximum.h>
#include <ATen/ops/_foreach_mul.h>

#include <cmath>
#include <memory>
#include <vector>

#include "adam_family/components.hpp"
#include "common/chunked.hpp"
#include "common/multi_tensor.hpp"
#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace kiln::adam_family {
namespace {

using kiln::optim::Param;
using kiln::optim::pick;

struct Adamax {
  const kiln_host_api* host;
  double beta1;
  double beta2;
  double eps;
};

void adamax_update(const Adamax& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group("adamax", group);
  const kiln::optim::StateStore state(opt.host, ctx);
  const double lr = group->lr, wd = group->weight_decay;
  // All state first, so that a host failure leaves every parameter untouched.
  const size_t n = params.size();
  std::vector<at::Tensor> exp_avgs(n), exp_infs(n), steps(n);
  for (size_t k = 0; k < n; ++k) {
    const Param& p = params[k];
    exp_avgs[k] = state.get(p, "exp_avg", KILN_STATE_ZEROS_LIKE_PARAM);
    exp_infs[k] = state.get(p, "exp_inf", KILN_STATE_ZEROS_LIKE_PARAM);
    steps[k] = state.get(p, "step", KILN_STATE_SCALAR_LIKE_PARAM);
  }
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    kiln::optim::BucketLists b = kiln::optim::bucket_lists(params, bucket);
    std::vector<at::Tensor> bucket_exp_avgs = pick(exp_avgs, bucket);
    std::vector<at::Tensor> bucket_exp_infs = pick(exp_infs, bucket);
    const std::vector<at::Tensor> bucket_steps = pick(steps, bucket);
    at::_foreach_add_(bucket_steps, 1);
    std::vector<double> step_size;
    for (double step : kiln::optim::host_values(bucket_steps)) {
      step_size.push_back((lr / (1.0 - std::pow(opt.beta1, step))) * -1.0);
    }
    kiln::optim::sweep_chunks(
        {&b.params, &b.grads, &bucket_exp_avgs, &bucket_exp_infs},
        [&](const std::vector<std::vector<at::Tensor>>& l, const std::vector<size_t>& which) {
          const std::vector<at::Tensor>&ps = l[0], &exp_avg = l[2], &exp_inf = l[3];
          std::vector<at::Tensor> gs = l[1];
          if (wd != 0.0) gs = at::_foreach_add(gs, ps, wd);
          at::_foreach_lerp_(exp_avg, gs, 1.0 - opt.beta1);
          // exp_inf = max(beta2 exp_inf, |g| + eps)
          at::_foreach_mul_(exp_inf, opt.beta2);
          std::vector<at::Tensor> abs_grads = at::_foreach_abs(gs);
          at::_foreach_add_(abs_grads, opt.eps);
          at::_foreach_maximum_(exp_inf, abs_grads);
          at::_foreach_addcdiv_(ps, exp_avg, exp_inf, kiln::optim::chunk_scalars(step_size, which));
        });
  }
}

kiln_status* adamax_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto opt = std::make_unique<Adamax>();
    opt->host = host;
    opt->beta1 = kiln_options_float(options, "beta1", 0.9);
    opt->beta2 = kiln_options_float(options, "beta2", 0.999);
    opt->eps = kiln_options_float(options, "eps", 1e-8);
    kiln::optim::check_range("adamax", "beta1", opt->beta1, 0.0, false, 1.0, true);
    kiln::optim::check_range("adamax", "beta2", opt->beta2, 0.0, false, 1.0, true);
    kiln::optim::check_range("adamax", "eps", opt->eps, 0.0, false, HUGE_VAL, false);
    *out = opt.release();
  });
}

void adamax_destroy(void* instance) { delete static_cast<Adamax*>(instance); }

kiln_status* adamax_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Adamax& opt = *static_cast<const Adamax*>(instance);
  return KILN_GUARD(opt.host, { adamax_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(adamax_create, adamax_destroy, adamax_step);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_RANGE_INIT("beta1", KILN_OPT_FLOAT, 0.0, 1.0, "0.9",
                           "decay rate of the gradient average (exp_avg), in [0, 1)"),
    KILN_OPTION_RANGE_INIT("beta2", KILN_OPT_FLOAT, 0.0, 1.0, "0.999",
                           "decay rate of the running maximum of |gradient| (exp_inf), in [0, 1)"),
    KILN_OPTION_MIN_INIT("eps", KILN_OPT_FLOAT, 0.0, "1e-8",
                         "added to |gradient| before the maximum, for numerical stability, >= 0"),
};

const kiln_capabilities kCaps = KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps);

}  // namespace

const kiln_component_descriptor kAdamax = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "adamax", KILN_VERSION_INIT(1, 0, 0),
    "Adamax as torch.optim.Adamax (Adam with the infinity norm)", &kCaps, kOptions, &kVtable);

}  // namespace kiln::adam_family
