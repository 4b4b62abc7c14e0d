// kiln_lamb — the "lamb" optimizer: LAMB (You et al., "Large Batch Optimization for Deep
// Learning") with decoupled weight decay, as apex FusedLAMB computes it (adam_w_mode, with the
// trust ratio applied to every parameter as with use_nvlamb), over the whole group per call
// with ATen's multi-tensor (_foreach) ops. Per step, for the group's gradients g:
//   clip = max_grad_norm / max(||(g_1..g_n)||, max_grad_norm)   (1 when max_grad_norm = 0)
//   g    = g * clip
//   m    = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   u    = (m / bc1) / (sqrt(v / bc2) + eps) + wd p,   bc_i = 1 - beta_i^step (1 without
//          bias_correction)
//   r    = ||p|| / ||u||   (1 when either norm is 0)
//   p    = p - lr r u
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/clamp_min.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

using kiln::optim::Param;

struct Lamb {
  const kiln_host_api* host;
  double beta1;
  double beta2;
  double eps;
  double max_grad_norm;
  bool bias_correction;
};

// Norms are accumulated and kept in float32 (float64 for float64 tensors), so half-precision
// parameters get a trust ratio as precise as float ones.
at::ScalarType norm_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// The group's gradients in their parameters' dtypes, scaled by the global-norm clip factor.
std::vector<std::vector<at::Tensor>> clipped_grads(
    const Lamb& opt, const std::vector<Param>& params,
    const std::vector<std::vector<size_t>>& buckets) {
  std::vector<std::vector<at::Tensor>> grads;
  std::vector<at::Tensor> norms;
  // The total is taken on the first parameter's device, in float64 if any bucket is float64.
  const at::Device total_device = params.empty() ? at::Device(at::kCPU) : params[0].param.device();
  at::ScalarType total_type = at::kFloat;
  for (const Param& p : params) {
    if (p.param.scalar_type() == at::kDouble) total_type = at::kDouble;
  }
  for (const auto& bucket : buckets) {
    std::vector<at::Tensor> gs;
    for (size_t k : bucket) {
      const at::ScalarType dtype = params[k].param.scalar_type();
      gs.push_back(params[k].grad.scalar_type() == dtype ? params[k].grad
                                                         : params[k].grad.to(dtype));
    }
    if (opt.max_grad_norm > 0.0) {
      for (const at::Tensor& n : at::_foreach_norm(gs, 2, norm_type(gs.front().scalar_type()))) {
        norms.push_back(n.to(total_device, total_type));
      }
    }
    grads.push_back(std::move(gs));
  }
  if (opt.max_grad_norm > 0.0 && !norms.empty()) {
    // apex FusedLAMB clips by the norm of all the group's gradients together.
    const at::Tensor total = at::linalg_vector_norm(at::stack(norms));
    const at::Tensor clip =
        at::clamp_min(total, opt.max_grad_norm).reciprocal() * opt.max_grad_norm;
    for (size_t b = 0; b < buckets.size(); ++b) {
      const at::Tensor& g0 = grads[b].front();
      grads[b] = at::_foreach_mul(grads[b], clip.to(g0.device(), norm_type(g0.scalar_type())));
    }
  }
  return grads;
}

void lamb_update(const Lamb& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group("lamb", group);
  const kiln::optim::StateStore state(opt.host, ctx);
  // All state first, so that a host failure leaves every parameter untouched.
  struct State {
    at::Tensor exp_avg, exp_avg_sq, step;
  };
  std::vector<State> st(params.size());
  for (size_t k = 0; k < params.size(); ++k) {
    st[k].exp_avg = state.get(params[k], "exp_avg", KILN_STATE_ZEROS_LIKE_PARAM);
    st[k].exp_avg_sq = state.get(params[k], "exp_avg_sq", KILN_STATE_ZEROS_LIKE_PARAM);
    // A float64 CPU counter: the bias corrections are needed on the host, without a sync.
    st[k].step = state.get(params[k], "step", KILN_STATE_SCALAR_F64);
  }
  const auto buckets = kiln::optim::by_device_and_dtype(params);
  const auto grads = clipped_grads(opt, params, buckets);
  const double wd = group->weight_decay;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const std::vector<at::Tensor>& gs = grads[b];
    std::vector<at::Tensor> ps, exp_avgs, exp_avg_sqs;
    std::vector<at::Scalar> bc1, bc2;
    for (size_t k : buckets[b]) {
      const Param& p = params[k];
      ps.push_back(p.param);
      exp_avgs.push_back(st[k].exp_avg);
      exp_avg_sqs.push_back(st[k].exp_avg_sq);
      double* count = st[k].step.data_ptr<double>();
      *count += 1.0;
      bc1.emplace_back(opt.bias_correction ? 1.0 - std::pow(opt.beta1, *count) : 1.0);
      bc2.emplace_back(opt.bias_correction ? 1.0 - std::pow(opt.beta2, *count) : 1.0);
    }
    at::_foreach_lerp_(exp_avgs, gs, 1.0 - opt.beta1);
    at::_foreach_mul_(exp_avg_sqs, opt.beta2);
    at::_foreach_addcmul_(exp_avg_sqs, gs, gs, 1.0 - opt.beta2);
    std::vector<at::Tensor> denom = at::_foreach_div(exp_avg_sqs, bc2);
    at::_foreach_sqrt_(denom);
    at::_foreach_add_(denom, opt.eps);
    std::vector<at::Tensor> update = at::_foreach_div(exp_avgs, bc1);
    at::_foreach_div_(update, denom);
    if (wd != 0.0) at::_foreach_add_(update, ps, wd);
    const at::ScalarType acc = norm_type(ps.front().scalar_type());
    const std::vector<at::Tensor> p_norms = at::_foreach_norm(ps, 2, acc);
    const std::vector<at::Tensor> u_norms = at::_foreach_norm(update, 2, acc);
    for (size_t i = 0; i < update.size(); ++i) {
      const at::Tensor& pn = p_norms[i];
      const at::Tensor& un = u_norms[i];
      update[i].mul_(at::where(pn.gt(0).logical_and(un.gt(0)), pn / un, at::ones_like(pn)));
    }
    at::_foreach_add_(ps, update, -group->lr);
  }
}

kiln_status* lamb_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto opt = std::make_unique<Lamb>();
    opt->host = host;
    opt->beta1 = kiln_options_float(options, "beta1", 0.9);
    opt->beta2 = kiln_options_float(options, "beta2", 0.999);
    opt->eps = kiln_options_float(options, "eps", 1e-6);
    opt->max_grad_norm = kiln_options_float(options, "max_grad_norm", 0.0);
    opt->bias_correction = kiln_options_bool(options, "bias_correction", 1) != 0;
    const double inf = HUGE_VAL;
    kiln::optim::check_range("lamb", "beta1", opt->beta1, 0.0, false, 1.0, true);
    kiln::optim::check_range("lamb", "beta2", opt->beta2, 0.0, false, 1.0, true);
    // eps > 0: a parameter whose gradient stays zero would otherwise divide 0 by 0.
    kiln::optim::check_range("lamb", "eps", opt->eps, 0.0, true, inf, false);
    kiln::optim::check_range("lamb", "max_grad_norm", opt->max_grad_norm, 0.0, false, inf, false);
    *out = opt.release();
  });
}

void lamb_destroy(void* instance) { delete static_cast<Lamb*>(instance); }

kiln_status* lamb_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Lamb& opt = *static_cast<const Lamb*>(instance);
  return KILN_GUARD(opt.host, { lamb_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(lamb_create, lamb_destroy, lamb_step);

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "beta1", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.9", nullptr,
     "decay rate of the gradient average (exp_avg), in [0, 1)"},
    {sizeof(kiln_option_spec), "beta2", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.999", nullptr,
     "decay rate of the squared-gradient average (exp_avg_sq), in [0, 1)"},
    {sizeof(kiln_option_spec), "eps", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "1e-6", nullptr,
     "term added to the denominator for numerical stability, > 0"},
    {sizeof(kiln_option_spec), "max_grad_norm", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "0.0", nullptr,
     "clip the group's global gradient norm to this first (0: no clipping)"},
    {sizeof(kiln_option_spec), "bias_correction", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "true", nullptr,
     "divide the moment averages by 1 - beta^step (Adam's bias correction)"},
};

const kiln_capabilities kCaps = {sizeof(kiln_capabilities), kiln::optim::kOptimizerCaps, 0,
                                 nullptr};

const kiln_component_descriptor kLamb = {
    sizeof(kiln_component_descriptor),
    KILN_COMPONENT_OPTIMIZER,
    0,
    "lamb",
    {1, 0, 0},
    "LAMB with decoupled weight decay and per-parameter trust ratio (apex FusedLAMB)",
    &kCaps,
    sizeof(kOptions) / sizeof(kOptions[0]),
    kOptions,
    &kVtable};

const kiln_component_descriptor* const kComponents[] = {&kLamb};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-lamb", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
