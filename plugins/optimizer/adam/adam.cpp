// kiln_adam — the "adam" and "adamw" optimizers: torch.optim.Adam (L2 weight decay added to the
// gradient) and torch.optim.AdamW (decoupled weight decay), optionally AMSGrad, over the whole
// group per call with ATen's fused kernels (_fused_adam_ / _fused_adamw_), as torch's
// fused=True path runs them (CPU tensors below ATen's grain size on the calling thread alone:
// common/calling_thread.hpp): the per-parameter "step" is a float32 0-dim tensor on the
// parameter's device, incremented before the kernel. Capturable (kiln/optimizer.h): the kernels
// take the device lr and found_inf.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

using kiln::optim::Param;

struct Adam {
  const kiln_host_api* host;
  const char* name;  // "adam" or "adamw"
  bool decoupled;    // AdamW's weight decay
  double beta1;
  double beta2;
  double eps;
  bool amsgrad;
};

void adam_update(const Adam& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group(opt.name, group);
  const kiln::optim::StateStore state(opt.host, ctx);
  const kiln::optim::DeviceScalars device = kiln::optim::device_scalars(opt.name, group);
  kiln::optim::FlatViews flat;
  // All state first, so that a host failure leaves every parameter untouched.
  struct State {
    at::Tensor exp_avg, exp_avg_sq, max_exp_avg_sq, step;
  };
  std::vector<State> st(params.size());
  for (size_t k = 0; k < params.size(); ++k) {
    const Param& p = params[k];
    st[k].exp_avg = state.get(p, "exp_avg", KILN_STATE_ZEROS_LIKE_PARAM);
    st[k].exp_avg_sq = state.get(p, "exp_avg_sq", KILN_STATE_ZEROS_LIKE_PARAM);
    if (opt.amsgrad) {
      st[k].max_exp_avg_sq = state.get(p, "max_exp_avg_sq", KILN_STATE_ZEROS_LIKE_PARAM);
    }
    st[k].step = state.get(p, "step", KILN_STATE_SCALAR_LIKE_PARAM);
  }
  for (const auto& bucket : kiln::optim::fused_kernel_buckets(params)) {
    std::vector<at::Tensor> ps, gs, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
    for (size_t k : bucket) {
      const Param& p = params[k];
      const at::ScalarType dtype = p.param.scalar_type();
      // The kernel walks memory linearly: every tensor of this parameter in one dense layout.
      const std::vector<int64_t> layout =
          kiln::optim::FlatViews::layout_for(p.param, st[k].exp_avg);
      ps.push_back(flat.flat(p.param, layout, dtype, true));
      gs.push_back(flat.flat(p.grad, layout, dtype, false));
      exp_avgs.push_back(flat.flat(st[k].exp_avg, layout, dtype, true));
      exp_avg_sqs.push_back(flat.flat(st[k].exp_avg_sq, layout, dtype, true));
      if (opt.amsgrad)
        max_exp_avg_sqs.push_back(flat.flat(st[k].max_exp_avg_sq, layout, dtype, true));
      steps.push_back(st[k].step);
    }
    at::_foreach_add_(steps, 1);
    const kiln::optim::CallingThreadOnly small(
        kiln::optim::steps_on_calling_thread(params[bucket.front()].param));
    if (device.defined()) {
      // Capturable: lr and the skip flag on the device; a skipped step takes its count back,
      // as torch.optim's fused path does under a GradScaler.
      if (opt.decoupled) {
        at::_fused_adamw_(ps, gs, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, device.lr,
                          opt.beta1, opt.beta2, group->weight_decay, opt.eps, opt.amsgrad,
                          /*maximize=*/false, /*grad_scale=*/std::nullopt, device.found_inf);
      } else {
        at::_fused_adam_(ps, gs, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, device.lr,
                         opt.beta1, opt.beta2, group->weight_decay, opt.eps, opt.amsgrad,
                         /*maximize=*/false, /*grad_scale=*/std::nullopt, device.found_inf);
      }
      at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), device.found_inf));
    } else if (opt.decoupled) {
      at::_fused_adamw_(ps, gs, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, group->lr, opt.beta1,
                        opt.beta2, group->weight_decay, opt.eps, opt.amsgrad,
                        /*maximize=*/false);
    } else {
      at::_fused_adam_(ps, gs, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, group->lr, opt.beta1,
                       opt.beta2, group->weight_decay, opt.eps, opt.amsgrad, /*maximize=*/false);
    }
  }
  flat.commit();
}

template <bool kDecoupled>
kiln_status* adam_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto opt = std::make_unique<Adam>();
    opt->host = host;
    opt->name = kDecoupled ? "adamw" : "adam";
    opt->decoupled = kDecoupled;
    opt->beta1 = kiln_options_float(options, "beta1", 0.9);
    opt->beta2 = kiln_options_float(options, "beta2", 0.999);
    opt->eps = kiln_options_float(options, "eps", 1e-8);
    opt->amsgrad = kiln_options_bool(options, "amsgrad", 0) != 0;
    kiln::optim::check_range(opt->name, "beta1", opt->beta1, 0.0, false, 1.0, true);
    kiln::optim::check_range(opt->name, "beta2", opt->beta2, 0.0, false, 1.0, true);
    kiln::optim::check_range(opt->name, "eps", opt->eps, 0.0, false, HUGE_VAL, false);
    *out = opt.release();
  });
}

void adam_destroy(void* instance) { delete static_cast<Adam*>(instance); }

kiln_status* adam_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Adam& opt = *static_cast<const Adam*>(instance);
  return KILN_GUARD(opt.host, { adam_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kAdamVtable =
    KILN_OPTIMIZER_VTABLE_INIT(adam_create<false>, adam_destroy, adam_step);
const kiln_optimizer_vtable kAdamWVtable =
    KILN_OPTIMIZER_VTABLE_INIT(adam_create<true>, adam_destroy, adam_step);

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "beta1", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.9", nullptr,
     "decay rate of the gradient average (exp_avg), in [0, 1)"},
    {sizeof(kiln_option_spec), "beta2", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.999", nullptr,
     "decay rate of the squared-gradient average (exp_avg_sq), in [0, 1)"},
    {sizeof(kiln_option_spec), "eps", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "1e-8", nullptr,
     "term added to the denominator for numerical stability, >= 0"},
    {sizeof(kiln_option_spec), "amsgrad", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "false", nullptr,
     "AMSGrad: normalise by the running maximum of exp_avg_sq (keeps max_exp_avg_sq)"},
};

const kiln_capabilities kCaps = {sizeof(kiln_capabilities),
                                 kiln::optim::kOptimizerCaps | KILN_CAP_CAPTURABLE, 0, nullptr};

const kiln_component_descriptor kAdam = {
    sizeof(kiln_component_descriptor),
    KILN_COMPONENT_OPTIMIZER,
    0,
    "adam",
    {1, 0, 0},
    "Adam as torch.optim.Adam (L2 weight decay added to the gradient; fused kernel)",
    &kCaps,
    sizeof(kOptions) / sizeof(kOptions[0]),
    kOptions,
    &kAdamVtable};

const kiln_component_descriptor kAdamW = {
    sizeof(kiln_component_descriptor),
    KILN_COMPONENT_OPTIMIZER,
    0,
    "adamw",
    {1, 0, 0},
    "AdamW as torch.optim.AdamW (decoupled weight decay from the group; fused kernel)",
    &kCaps,
    sizeof(kOptions) / sizeof(kOptions[0]),
    kOptions,
    &kAdamWVtable};

const kiln_component_descriptor* const kComponents[] = {&kAdam, &kAdamW};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-adam", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
