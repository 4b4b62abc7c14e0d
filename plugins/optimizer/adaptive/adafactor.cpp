// "adafactor": torch.optim.Adafactor (the second moment of a parameter of two or more dimensions
// kept factored as a row and a column average of the squared gradient; 1 - beta2_t = t^beta2_decay;
// the step relative to the parameter's RMS, the update's RMS clipped to d; weight decay applied
// to the parameter), over the whole group per call in the order of torch's
// _multi_tensor_adafactor.
//
// State as torch names it: "step" (0-dim float32 on the parameter's device), and for a parameter
// of shape [..., R, C] "row_var" ([..., R, 1]) and "col_var" ([..., 1, C]), of torch's shapes
// (host state_tensor_shaped, Kiln ABI 1.14), for one of fewer than two dimensions "variance"
// (its shape). All in the parameter's dtype, as torch makes them from the gradient.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_clamp_min.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_rsqrt.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mean.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "adaptive/components.hpp"
#include "common/multi_tensor.hpp"
#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace kiln::adaptive {
namespace {

using kiln::optim::Param;
using kiln::optim::pick;

struct Adafactor {
  const kiln_host_api* host;
  double beta2_decay;
  double eps1;  // -1: torch's None, the machine epsilon of the parameter's dtype
  double eps2;
  double d;
};

// The 2-norm of each tensor on the host (one copy per call for a device).
std::vector<double> norms(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors) out.push_back(at::linalg_vector_norm(t, 2));
  return kiln::optim::host_values(out);
}

// A host state tensor of torch's shape `shape`, in the parameter's dtype.
at::Tensor shaped_state(const Adafactor& opt, kiln_call_context* ctx, const Param& p,
                        const char* name, const std::vector<int64_t>& shape) {
  DLTensor view{};
  kiln::optim::check_host(opt.host,
                          opt.host->state_tensor_shaped(
                              ctx, p.index, name, kiln::dl_dtype_of(p.param.scalar_type()),
                              static_cast<int32_t>(shape.size()), shape.data(), &view, nullptr));
  at::Tensor t = kiln::thread_view_cache().get(view);
  if (t.sizes() != at::IntArrayRef(shape) || t.device() != p.param.device() ||
      t.scalar_type() != p.param.scalar_type()) {
    throw kiln::Error(KILN_ERR_INTERNAL, std::string("host state tensor '") + name +
                                             "' of parameter " + std::to_string(p.index) +
                                             " has an unexpected layout");
  }
  return t;
}

// Steps the parameters `sub` of one bucket, all of two or more dimensions (`factored`) or all of
// fewer.
void adafactor_bucket(const Adafactor& opt, const kiln_param_group* group,
                      const std::vector<Param>& params, const std::vector<size_t>& sub,
                      bool factored, const std::vector<at::Tensor>& row_vars,
                      const std::vector<at::Tensor>& col_vars,
                      const std::vector<at::Tensor>& variances,
                      const std::vector<at::Tensor>& steps) {
  const double lr = group->lr, wd = group->weight_decay;
  kiln::optim::BucketLists b = kiln::optim::bucket_lists(params, sub);
  std::vector<at::Tensor> ps = b.params, gs = b.grads;
  const double eps1 = opt.eps1 < 0.0 ? kiln::optim::dtype_eps(ps.front().scalar_type()) : opt.eps1;
  const std::vector<at::Tensor> bucket_steps = pick(steps, sub);
  at::_foreach_add_(bucket_steps, 1.0);

  // 1 - beta2_t = t^beta2_decay, the relative step rho_t = min(lr, 1/sqrt(t)) and
  // alpha = max(eps2, RMS(p)) rho_t, from the parameters before weight decay.
  const std::vector<double> step_values = kiln::optim::host_values(bucket_steps);
  const std::vector<double> param_norms = norms(ps);
  std::vector<double> one_minus_beta2, alphas;
  for (size_t i = 0; i < ps.size(); ++i) {
    const double step = step_values[i];
    one_minus_beta2.push_back(std::pow(step, opt.beta2_decay));
    const double rho = std::min(lr, 1.0 / std::pow(step, 0.5));
    const double rms = param_norms[i] / std::pow(static_cast<double>(ps[i].numel()), 0.5);
    alphas.push_back(std::max(opt.eps2, rms) * rho);
  }
  if (wd != 0.0) at::_foreach_mul_(ps, 1.0 - lr * wd);

  std::vector<at::Tensor> var_estimates;
  if (factored) {
    std::vector<at::Tensor> rows, cols, row_means, col_means;
    std::vector<double> row_sizes, col_sizes;
    for (size_t i = 0; i < sub.size(); ++i) {
      rows.push_back(row_vars[sub[i]]);
      cols.push_back(col_vars[sub[i]]);
      row_means.push_back(at::linalg_vector_norm(gs[i], 2, at::IntArrayRef{-1}, true));
      col_means.push_back(at::linalg_vector_norm(gs[i], 2, at::IntArrayRef{-2}, true));
      row_sizes.push_back(static_cast<double>(gs[i].size(-1)));
      col_sizes.push_back(static_cast<double>(gs[i].size(-2)));
    }
    // Row and column means of g², folded into the factors.
    at::_foreach_mul_(row_means, row_means);
    at::_foreach_div_(row_means, kiln::optim::scalar_list(row_sizes));
    at::_foreach_lerp_(rows, row_means, kiln::optim::scalar_list(one_minus_beta2));
    at::_foreach_mul_(col_means, col_means);
    at::_foreach_div_(col_means, kiln::optim::scalar_list(col_sizes));
    at::_foreach_lerp_(cols, col_means, kiln::optim::scalar_list(one_minus_beta2));
    // The variance estimate row_var @ col_var / mean(row_var), the mean at least eps1.
    std::vector<at::Tensor> row_var_means;
    for (size_t i = 0; i < sub.size(); ++i) {
      var_estimates.push_back(at::matmul(rows[i], cols[i]));
      row_var_means.push_back(rows[i].mean(at::IntArrayRef{-2}, true));
    }
    at::_foreach_clamp_min_(row_var_means, eps1);
    at::_foreach_div_(var_estimates, row_var_means);
  } else {
    const std::vector<at::Tensor> bucket_variances = pick(variances, sub);
    const std::vector<at::Tensor> grads_squared = at::_foreach_mul(gs, gs);
    at::_foreach_lerp_(bucket_variances, grads_squared, kiln::optim::scalar_list(one_minus_beta2));
    for (const at::Tensor& v : bucket_variances) var_estimates.push_back(v.clone());
  }

  // update = g / sqrt(max(var, eps1²)), scaled by -alpha / max(1, RMS(update) / d).
  at::_foreach_clamp_min_(var_estimates, eps1 * eps1);
  at::_foreach_rsqrt_(var_estimates);
  at::_foreach_mul_(var_estimates, gs);
  const std::vector<at::Tensor>& updates = var_estimates;
  const std::vector<double> update_norms = norms(updates);
  std::vector<double> scales;
  for (size_t i = 0; i < updates.size(); ++i) {
    const double rms = std::pow(static_cast<double>(updates[i].numel()), 0.5) * opt.d;
    scales.push_back(-alphas[i] / std::max(1.0, update_norms[i] / rms));
  }
  at::_foreach_mul_(updates, kiln::optim::scalar_list(scales));
  at::_foreach_add_(ps, updates);
}

void adafactor_update(const Adafactor& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group("adafactor", group);
  const kiln::optim::StateStore state(opt.host, ctx);
  // All state first, so that a host failure leaves every parameter untouched.
  const size_t n = params.size();
  std::vector<at::Tensor> row_vars(n), col_vars(n), variances(n), steps(n);
  for (size_t k = 0; k < n; ++k) {
    const Param& p = params[k];
    steps[k] = state.get(p, "step", KILN_STATE_SCALAR_LIKE_PARAM);
    if (p.param.dim() > 1) {
      std::vector<int64_t> row_shape = p.param.sizes().vec(), col_shape = row_shape;
      row_shape[row_shape.size() - 1] = 1;
      col_shape[col_shape.size() - 2] = 1;
      row_vars[k] = shaped_state(opt, ctx, p, "row_var", row_shape);
      col_vars[k] = shaped_state(opt, ctx, p, "col_var", col_shape);
    } else {
      variances[k] = state.get(p, "variance", KILN_STATE_ZEROS_LIKE_PARAM);
    }
  }
  // As torch groups them: by device and dtype, then factored or not.
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    std::vector<size_t> factored, vectors;
    for (size_t k : bucket) (params[k].param.dim() > 1 ? factored : vectors).push_back(k);
    if (!factored.empty()) {
      adafactor_bucket(opt, group, params, factored, true, row_vars, col_vars, variances, steps);
    }
    if (!vectors.empty()) {
      adafactor_bucket(opt, group, params, vectors, false, row_vars, col_vars, variances, steps);
    }
  }
}

kiln_status* adafactor_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    if (!KILN_HAS_FIELD(host, kiln_host_api, state_tensor_shaped) ||
        host->state_tensor_shaped == nullptr) {
      throw kiln::Error(KILN_ERR_UNSUPPORTED,
                        "adafactor: the host is older than Kiln ABI 1.14 (no shaped state for "
                        "row_var and col_var)");
    }
    auto opt = std::make_unique<Adafactor>();
    opt->host = host;
    opt->beta2_decay = kiln_options_float(options, "beta2_decay", -0.8);
    opt->eps1 = kiln_options_float(options, "eps1", -1.0);
    opt->eps2 = kiln_options_float(options, "eps2", 1e-3);
    opt->d = kiln_options_float(options, "d", 1.0);
    const double inf = HUGE_VAL;
    kiln::optim::check_range("adafactor", "beta2_decay", opt->beta2_decay, -inf, false, 0.0, false);
    if (opt->eps1 != -1.0) {
      kiln::optim::check_range("adafactor", "eps1 (or -1 for the dtype's epsilon)", opt->eps1, 0.0,
                               false, inf, false);
    }
    kiln::optim::check_range("adafactor", "eps2", opt->eps2, 0.0, false, inf, false);
    kiln::optim::check_range("adafactor", "d", opt->d, 1.0, false, inf, false);
    *out = opt.release();
  });
}

void adafactor_destroy(void* instance) { delete static_cast<Adafactor*>(instance); }

kiln_status* adafactor_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Adafactor& opt = *static_cast<const Adafactor*>(instance);
  return KILN_GUARD(opt.host, { adafactor_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(adafactor_create, adafactor_destroy, adafactor_step);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_SPEC_INIT("beta2_decay", KILN_OPT_FLOAT, 0, 0.0, 1, 0.0, "-0.8", nullptr,
                          "decay of the second-moment rate: 1 - beta2 at step t is "
                          "t^beta2_decay, <= 0"),
    KILN_OPTION_MIN_INIT("eps1", KILN_OPT_FLOAT, -1.0, "-1.0",
                         "floor of the variance estimate's row mean, squared for the estimate "
                         "(torch's eps[0]), >= 0; -1: the parameter dtype's machine epsilon "
                         "(torch's None)"),
    KILN_OPTION_MIN_INIT("eps2", KILN_OPT_FLOAT, 0.0, "1e-3",
                         "floor of the parameter's RMS in the relative step size (torch's "
                         "eps[1]), >= 0"),
    KILN_OPTION_MIN_INIT("d", KILN_OPT_FLOAT, 1.0, "1.0",
                         "clipping threshold: the update's RMS is scaled down to at most d, >= 1"),
};

const kiln_capabilities kCaps = KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps);

}  // namespace

const kiln_component_descriptor kAdafactor = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "adafactor", KILN_VERSION_INIT(1, 0, 0),
    "Adafactor as torch.optim.Adafactor (row and column statistics as torch keeps them)", &kCaps,
    kOptions, &kVtable);

}  // namespace kiln::adaptive
