// "adagrad": torch.optim.Adagrad (each coordinate's step divided by the root of its summed
// squared gradients; the rate decayed by lr_decay per step; L2 weight decay added to the
// gradient), over the whole group per call: on the CPU with ATen's fused kernel as torch's
// fused=True path, elsewhere in the order of torch's _multi_tensor_adagrad. State as torch names
// it: "step" (0-dim float32 on the parameter's device), "sum" (started at
// initial_accumulator_value).
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_fused_adagrad.h>

#include <cmath>
#include <memory>
#include <vector>

#include "adaptive/components.hpp"
#include "common/calling_thread.hpp"
#include "common/multi_tensor.hpp"
#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace kiln::adaptive {
namespace {

using kiln::optim::Param;
using kiln::optim::pick;

struct Adagrad {
  const kiln_host_api* host;
  double lr_decay;
  double initial_accumulator_value;
  double eps;
};

void adagrad_update(const Adagrad& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group("adagrad", group);
  const kiln::optim::StateStore state(opt.host, ctx);
  const double lr = group->lr, wd = group->weight_decay;
  // All state first, so that a host failure leaves every parameter untouched.
  const size_t n = params.size();
  std::vector<at::Tensor> sums(n), steps(n);
  for (size_t k = 0; k < n; ++k) {
    const Param& p = params[k];
    sums[k] = kiln::optim::full_state(state, p, "sum", opt.initial_accumulator_value);
    steps[k] = state.get(p, "step", KILN_STATE_SCALAR_LIKE_PARAM);
  }
  // On the CPU, ATen's fused kernel (torch's fused=True path; torch has none for CUDA): one pass
  // over each tensor's memory instead of six sweeps of the group.
  kiln::optim::FlatViews flat;
  for (const auto& bucket : kiln::optim::fused_kernel_buckets(params)) {
    if (!params[bucket.front()].param.is_cpu()) continue;
    std::vector<at::Tensor> ps, gs, bucket_sums, bucket_steps;
    for (size_t k : bucket) {
      const Param& p = params[k];
      const at::ScalarType dtype = p.param.scalar_type();
      // The kernel walks memory linearly: every tensor of this parameter in one dense layout.
      const std::vector<int64_t> layout = kiln::optim::FlatViews::layout_for(p.param, sums[k]);
      ps.push_back(flat.flat(p.param, layout, dtype, true));
      gs.push_back(flat.flat(p.grad, layout, dtype, false));
      bucket_sums.push_back(flat.flat(sums[k], layout, dtype, true));
      bucket_steps.push_back(steps[k]);
    }
    at::_foreach_add_(bucket_steps, 1);
    const kiln::optim::CallingThreadOnly small(
        kiln::optim::steps_on_calling_thread(params[bucket.front()].param));
    at::_fused_adagrad_(ps, gs, bucket_sums, bucket_steps, lr, opt.lr_decay, wd, opt.eps,
                        /*maximize=*/false);
  }
  flat.commit();
  // Elsewhere, torch's _multi_tensor_adagrad.
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    if (params[bucket.front()].param.is_cpu()) continue;
    kiln::optim::BucketLists b = kiln::optim::bucket_lists(params, bucket);
    std::vector<at::Tensor> ps = b.params, gs = b.grads;
    const std::vector<at::Tensor> bucket_sums = pick(sums, bucket);
    const std::vector<at::Tensor> bucket_steps = pick(steps, bucket);
    at::_foreach_add_(bucket_steps, 1);
    if (wd != 0.0) gs = at::_foreach_add(gs, ps, wd);
    // -clr = -lr / (1 + (step - 1) lr_decay)
    std::vector<double> minus_clr;
    for (double step : kiln::optim::host_values(bucket_steps)) {
      minus_clr.push_back(-lr / (1.0 + (step - 1.0) * opt.lr_decay));
    }
    at::_foreach_addcmul_(bucket_sums, gs, gs, 1);
    std::vector<at::Tensor> std_ = at::_foreach_sqrt(bucket_sums);
    at::_foreach_add_(std_, opt.eps);
    const std::vector<at::Tensor> numerator =
        at::_foreach_mul(gs, kiln::optim::scalar_list(minus_clr));
    at::_foreach_addcdiv_(ps, numerator, std_);
  }
}

kiln_status* adagrad_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto opt = std::make_unique<Adagrad>();
    opt->host = host;
    opt->lr_decay = kiln_options_float(options, "lr_decay", 0.0);
    opt->initial_accumulator_value = kiln_options_float(options, "initial_accumulator_value", 0.0);
    opt->eps = kiln_options_float(options, "eps", 1e-10);
    const double inf = HUGE_VAL;
    kiln::optim::check_range("adagrad", "lr_decay", opt->lr_decay, 0.0, false, inf, false);
    kiln::optim::check_range("adagrad", "initial_accumulator_value", opt->initial_accumulator_value,
                             0.0, false, inf, false);
    kiln::optim::check_range("adagrad", "eps", opt->eps, 0.0, false, inf, false);
    *out = opt.release();
  });
}

void adagrad_destroy(void* instance) { delete static_cast<Adagrad*>(instance); }

kiln_status* adagrad_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Adagrad& opt = *static_cast<const Adagrad*>(instance);
  return KILN_GUARD(opt.host, { adagrad_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(adagrad_create, adagrad_destroy, adagrad_step);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_MIN_INIT("lr_decay", KILN_OPT_FLOAT, 0.0, "0.0",
                         "rate decay: step t runs at lr / (1 + (t - 1) lr_decay), >= 0"),
    KILN_OPTION_MIN_INIT("initial_accumulator_value", KILN_OPT_FLOAT, 0.0, "0.0",
                         "starting value of the squared-gradient sum (sum), >= 0"),
    KILN_OPTION_MIN_INIT("eps", KILN_OPT_FLOAT, 0.0, "1e-10",
                         "term added to the denominator for numerical stability, >= 0"),
};

const kiln_capabilities kCaps = KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps);

}  // namespace

const kiln_component_descriptor kAdagrad = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "adagrad", KILN_VERSION_INIT(1, 0, 0),
    "Adagrad as torch.optim.Adagrad (dense gradients)", &kCaps, kOptions, &kVtable);

}  // namespace kiln::adaptive
