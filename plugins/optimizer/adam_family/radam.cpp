// "radam": torch.optim.RAdam (Adam whose adaptive step is rectified by the variance of the
// approximated simple moving average, plain momentum SGD while that is not yet tractable; L2
// weight decay added to the gradient, or decoupled as AdamW), over the whole group per call in
// the order of torch's _multi_tensor_radam (in cache-sized chunks: common/chunked.hpp). State as
// torch names it: "step" (0-dim float32 on the parameter's device), "exp_avg", "exp_avg_sq".
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_reciprocal.h>
#include <ATen/ops/_foreach_sqrt.h>

#include <cmath>
#include <memory>
#include <vector>

#include "adam_family/components.hpp"
#include "adam_family/moments.hpp"
#include "common/chunked.hpp"
#include "common/multi_tensor.hpp"
#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace kiln::adam_family {
namespace {

using kiln::optim::Param;
using kiln::optim::pick;

struct RAdam {
  const kiln_host_api* host;
  double beta1;
  double beta2;
  double eps;
  bool decoupled;  // weight decay applied to the parameter (AdamW), not added to the gradient
};

void radam_update(const RAdam& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group("radam", group);
  const kiln::optim::StateStore state(opt.host, ctx);
  const double lr = group->lr, wd = group->weight_decay;
  // All state first, so that a host failure leaves every parameter untouched.
  const size_t n = params.size();
  std::vector<at::Tensor> exp_avgs(n), exp_avg_sqs(n), steps(n);
  for (size_t k = 0; k < n; ++k) {
    const Param& p = params[k];
    exp_avgs[k] = state.get(p, "exp_avg", KILN_STATE_ZEROS_LIKE_PARAM);
    exp_avg_sqs[k] = state.get(p, "exp_avg_sq", KILN_STATE_ZEROS_LIKE_PARAM);
    steps[k] = state.get(p, "step", KILN_STATE_SCALAR_LIKE_PARAM);
  }
  // The maximum length of the approximated SMA.
  const double rho_inf = 2.0 / (1.0 - opt.beta2) - 1.0;
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    kiln::optim::BucketLists b = kiln::optim::bucket_lists(params, bucket);
    std::vector<at::Tensor> bucket_exp_avgs = pick(exp_avgs, bucket);
    std::vector<at::Tensor> bucket_exp_avg_sqs = pick(exp_avg_sqs, bucket);
    const std::vector<at::Tensor> bucket_steps = pick(steps, bucket);
    at::_foreach_add_(bucket_steps, 1);
    const std::vector<double> step_values = kiln::optim::host_values(bucket_steps);

    // Per parameter: rectified (rho_t > 5), the adaptive step
    //   p -= lr * rect * sqrt(1 - beta2^t) / (1 - beta1^t) * exp_avg / (sqrt(exp_avg_sq) + eps)
    // as torch's buffer (reciprocal of (sqrt(v) + eps) / step size); else the unrectified
    //   p -= lr / (1 - beta1^t) * exp_avg.
    // torch's multi-tensor path steps both through the buffer (an infinite quotient whose
    // reciprocal is 0 for the unrectified ones); they are stepped apart here, which is the same
    // sum and stays finite where sqrt(v) + eps is 0 (eps = 0 and a zero gradient).
    // Powers as torch's Python computes them (x ** 0.5 is pow, not sqrt).
    std::vector<bool> rectified(step_values.size());
    std::vector<double> step_size(step_values.size());
    for (size_t i = 0; i < step_values.size(); ++i) {
      const double step = step_values[i];
      const double beta2_t = std::pow(opt.beta2, step);
      const double rho_t = rho_inf - 2.0 * step * beta2_t / (1.0 - beta2_t);
      const double bias_correction1 = 1.0 - std::pow(opt.beta1, step);
      rectified[i] = rho_t > 5.0;
      if (rectified[i]) {
        const double rect = std::pow(
            (rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t),
            0.5);
        step_size[i] = std::pow(1.0 - beta2_t, 0.5) * (lr * rect / bias_correction1) * -1.0;
      } else {
        step_size[i] = (lr * 1.0 / bias_correction1) * -1.0;
      }
    }
    kiln::optim::sweep_chunks(
        {&b.params, &b.grads, &bucket_exp_avgs, &bucket_exp_avg_sqs},
        [&](const std::vector<std::vector<at::Tensor>>& l, const std::vector<size_t>& which) {
          const std::vector<at::Tensor>&ps = l[0], &exp_avg = l[2], &exp_avg_sq = l[3];
          const std::vector<at::Tensor> gs = decay_and_moments(
              {lr, wd, opt.beta1, opt.beta2, opt.decoupled}, ps, l[1], exp_avg, exp_avg_sq);
          std::vector<size_t> rect, unrect;  // positions in the chunk
          for (size_t j = 0; j < which.size(); ++j)
            (rectified[which[j]] ? rect : unrect).push_back(j);
          if (!rect.empty()) {
            std::vector<at::Tensor> buffer = at::_foreach_sqrt(pick(exp_avg_sq, rect));
            at::_foreach_add_(buffer, opt.eps);
            at::_foreach_div_(buffer, kiln::optim::chunk_scalars(step_size, pick(which, rect)));
            at::_foreach_reciprocal_(buffer);
            at::_foreach_addcmul_(pick(ps, rect), pick(exp_avg, rect), buffer);
          }
          if (!unrect.empty()) {
            const std::vector<at::Tensor> update = at::_foreach_mul(
                pick(exp_avg, unrect), kiln::optim::chunk_scalars(step_size, pick(which, unrect)));
            at::_foreach_add_(pick(ps, unrect), update);
          }
        });
  }
}

kiln_status* radam_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto opt = std::make_unique<RAdam>();
    opt->host = host;
    opt->beta1 = kiln_options_float(options, "beta1", 0.9);
    opt->beta2 = kiln_options_float(options, "beta2", 0.999);
    opt->eps = kiln_options_float(options, "eps", 1e-8);
    opt->decoupled = kiln_options_bool(options, "decoupled_weight_decay", 0) != 0;
    kiln::optim::check_range("radam", "beta1", opt->beta1, 0.0, false, 1.0, true);
    kiln::optim::check_range("radam", "beta2", opt->beta2, 0.0, false, 1.0, true);
    kiln::optim::check_range("radam", "eps", opt->eps, 0.0, false, HUGE_VAL, false);
    *out = opt.release();
  });
}

void radam_destroy(void* instance) { delete static_cast<RAdam*>(instance); }

kiln_status* radam_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const RAdam& opt = *static_cast<const RAdam*>(instance);
  return KILN_GUARD(opt.host, { radam_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(radam_create, radam_destroy, radam_step);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_RANGE_INIT("beta1", KILN_OPT_FLOAT, 0.0, 1.0, "0.9",
                           "decay rate of the gradient average (exp_avg), in [0, 1)"),
    KILN_OPTION_RANGE_INIT("beta2", KILN_OPT_FLOAT, 0.0, 1.0, "0.999",
                           "decay rate of the squared-gradient average (exp_avg_sq), in [0, 1)"),
    KILN_OPTION_MIN_INIT("eps", KILN_OPT_FLOAT, 0.0, "1e-8",
                         "term added to the denominator for numerical stability, >= 0"),
    KILN_OPTION_INIT("decoupled_weight_decay", KILN_OPT_BOOL, "false",
                     "decay the weights directly (as AdamW) instead of adding the decay to the "
                     "gradient"),
};

const kiln_capabilities kCaps = KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps);

}  // namespace

const kiln_component_descriptor kRAdam = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "radam", KILN_VERSION_INIT(1, 0, 0),
    "RAdam as torch.optim.RAdam (optionally decoupled_weight_decay)", &kCaps, kOptions, &kVtable);

}  // namespace kiln::adam_family
