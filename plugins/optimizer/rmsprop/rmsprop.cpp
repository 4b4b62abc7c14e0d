// kiln_rmsprop — the "rmsprop" optimizer: torch.optim.RMSprop (smoothing alpha, eps, weight decay
// added to the gradient, optional momentum and centering) over the whole group per call with
// ATen's multi-tensor (_foreach) ops, in the order of torch's _multi_tensor_rmsprop.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>

#include <memory>
#include <string>
#include <vector>

#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

using kiln::optim::Param;

struct RmsProp {
  const kiln_host_api* host;
  double alpha;
  double eps;
  double momentum;
  bool centered;
};

void rmsprop_update(const RmsProp& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group("rmsprop", group);
  const kiln::optim::StateStore state(opt.host, ctx);
  const double lr = group->lr, wd = group->weight_decay;
  // All state first, so that a host failure leaves every parameter untouched.
  struct State {
    at::Tensor square_avg, momentum_buffer, grad_avg, step;
  };
  std::vector<State> st(params.size());
  for (size_t k = 0; k < params.size(); ++k) {
    const Param& p = params[k];
    st[k].square_avg = state.get(p, "square_avg", KILN_STATE_ZEROS_LIKE_PARAM);
    if (opt.momentum > 0.0) {
      st[k].momentum_buffer = state.get(p, "momentum_buffer", KILN_STATE_ZEROS_LIKE_PARAM);
    }
    if (opt.centered) st[k].grad_avg = state.get(p, "grad_avg", KILN_STATE_ZEROS_LIKE_PARAM);
    st[k].step = state.get(p, "step", KILN_STATE_SCALAR_LIKE_PARAM);
  }
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    std::vector<at::Tensor> ps, gs, square_avgs, grad_avgs, bufs, steps;
    for (size_t k : bucket) {
      const Param& p = params[k];
      ps.push_back(p.param);
      gs.push_back(p.grad.scalar_type() == p.param.scalar_type()
                       ? p.grad
                       : p.grad.to(p.param.scalar_type()));
      square_avgs.push_back(st[k].square_avg);
      if (opt.momentum > 0.0) bufs.push_back(st[k].momentum_buffer);
      if (opt.centered) grad_avgs.push_back(st[k].grad_avg);
      steps.push_back(st[k].step);
    }
    at::_foreach_add_(steps, 1);
    if (wd != 0.0) gs = at::_foreach_add(gs, ps, wd);
    at::_foreach_mul_(square_avgs, opt.alpha);
    at::_foreach_addcmul_(square_avgs, gs, gs, 1.0 - opt.alpha);
    std::vector<at::Tensor> avg;
    if (opt.centered) {
      at::_foreach_lerp_(grad_avgs, gs, 1.0 - opt.alpha);
      avg = at::_foreach_addcmul(square_avgs, grad_avgs, grad_avgs, -1.0);
      at::_foreach_sqrt_(avg);
    } else {
      avg = at::_foreach_sqrt(square_avgs);
    }
    at::_foreach_add_(avg, opt.eps);
    if (opt.momentum > 0.0) {
      at::_foreach_mul_(bufs, opt.momentum);
      at::_foreach_addcdiv_(bufs, gs, avg);
      at::_foreach_add_(ps, bufs, -lr);
    } else {
      at::_foreach_addcdiv_(ps, gs, avg, -lr);
    }
  }
}

kiln_status* rmsprop_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto opt = std::make_unique<RmsProp>();
    opt->host = host;
    opt->alpha = kiln_options_float(options, "alpha", 0.99);
    opt->eps = kiln_options_float(options, "eps", 1e-8);
    opt->momentum = kiln_options_float(options, "momentum", 0.0);
    opt->centered = kiln_options_bool(options, "centered", 0) != 0;
    const double inf = HUGE_VAL;
    kiln::optim::check_range("rmsprop", "alpha", opt->alpha, 0.0, false, 1.0, false);
    kiln::optim::check_range("rmsprop", "eps", opt->eps, 0.0, false, inf, false);
    kiln::optim::check_range("rmsprop", "momentum", opt->momentum, 0.0, false, 1.0, true);
    *out = opt.release();
  });
}

void rmsprop_destroy(void* instance) { delete static_cast<RmsProp*>(instance); }

kiln_status* rmsprop_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const RmsProp& opt = *static_cast<const RmsProp*>(instance);
  return KILN_GUARD(opt.host, { rmsprop_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(rmsprop_create, rmsprop_destroy, rmsprop_step);

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "alpha", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.99", nullptr,
     "smoothing constant of the squared-gradient average, in [0, 1]"},
    {sizeof(kiln_option_spec), "eps", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "1e-8", nullptr,
     "term added to the denominator for numerical stability, >= 0"},
    {sizeof(kiln_option_spec), "momentum", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.0", nullptr,
     "momentum factor, in [0, 1) (0: no momentum buffer)"},
    {sizeof(kiln_option_spec), "centered", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "false", nullptr,
     "normalise by the variance estimate (keeps a gradient average) instead of the raw average"},
};

const kiln_capabilities kCaps = {sizeof(kiln_capabilities), kiln::optim::kOptimizerCaps, 0,
                                 nullptr};

const kiln_component_descriptor kRmsProp = {sizeof(kiln_component_descriptor),
                                            KILN_COMPONENT_OPTIMIZER,
                                            0,
                                            "rmsprop",
                                            {1, 0, 0},
                                            "RMSprop as torch.optim.RMSprop",
                                            &kCaps,
                                            sizeof(kOptions) / sizeof(kOptions[0]),
                                            kOptions,
                                            &kVtable};

const kiln_component_descriptor* const kComponents[] = {&kRmsProp};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-rmsprop", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
