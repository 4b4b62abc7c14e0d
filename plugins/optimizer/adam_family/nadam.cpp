// "nadam": torch.optim.NAdam (Adam with Nesterov momentum whose factor mu_t warms up by
// momentum_decay; L2 weight decay added to the gradient, or decoupled as NAdamW), over the whole
// group per call in the order of torch's _multi_tensor_nadam (in cache-sized chunks:
// common/chunked.hpp). State as torch names it: "step"
// and "mu_product" (the running product of the mu_t; 0-dim float32 on the parameter's device),
// "exp_avg", "exp_avg_sq".
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
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

struct NAdam {
  const kiln_host_api* host;
  double beta1;
  double beta2;
  double eps;
  double momentum_decay;
  bool decoupled;  // NAdamW: weight decay applied to the parameter, not added to the gradient
};

// mu_t = beta1 (1 - 0.5 * 0.96^(t * momentum_decay)).
double mu_at(const NAdam& opt, double step) {
  return opt.beta1 * (1.0 - 0.5 * std::pow(0.96, step * opt.momentum_decay));
}

void nadam_update(const NAdam& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group("nadam", group);
  const kiln::optim::StateStore state(opt.host, ctx);
  const double lr = group->lr, wd = group->weight_decay;
  // All state first, so that a host failure leaves every parameter untouched.
  const size_t n = params.size();
  std::vector<at::Tensor> exp_avgs(n), exp_avg_sqs(n), mu_products(n), steps(n);
  for (size_t k = 0; k < n; ++k) {
    const Param& p = params[k];
    exp_avgs[k] = state.get(p, "exp_avg", KILN_STATE_ZEROS_LIKE_PARAM);
    exp_avg_sqs[k] = state.get(p, "exp_avg_sq", KILN_STATE_ZEROS_LIKE_PARAM);
    mu_products[k] = kiln::optim::scalar_state(state, p, "mu_product", 1.0);
    steps[k] = state.get(p, "step", KILN_STATE_SCALAR_LIKE_PARAM);
  }
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    kiln::optim::BucketLists b = kiln::optim::bucket_lists(params, bucket);
    std::vector<at::Tensor> bucket_exp_avgs = kiln::optim::pick(exp_avgs, bucket);
    std::vector<at::Tensor> bucket_exp_avg_sqs = kiln::optim::pick(exp_avg_sqs, bucket);
    const std::vector<at::Tensor> bucket_mu_products = kiln::optim::pick(mu_products, bucket);
    const std::vector<at::Tensor> bucket_steps = kiln::optim::pick(steps, bucket);
    at::_foreach_add_(bucket_steps, 1);

    // The per-parameter scalars first, then the element-wise update in cache-sized chunks.
    const std::vector<double> step_values = kiln::optim::host_values(bucket_steps);
    std::vector<double> bias_correction_sqrt, mus, mu_nexts;
    for (double step : step_values) {
      bias_correction_sqrt.push_back(std::pow(1.0 - std::pow(opt.beta2, step), 0.5));  // ** 0.5
      mus.push_back(mu_at(opt, step));
      mu_nexts.push_back(mu_at(opt, step + 1.0));
    }
    at::_foreach_mul_(bucket_mu_products, kiln::optim::scalar_list(mus));
    // The step sizes from mu_product as stored (float32), as torch reads it back.
    const std::vector<double> mu_product_values = kiln::optim::host_values(bucket_mu_products);
    std::vector<double> grad_step, exp_avg_step;
    for (size_t i = 0; i < mus.size(); ++i) {
      const double mu_product = mu_product_values[i];
      grad_step.push_back(-(lr * (1.0 - mus[i]) / (1.0 - mu_product)));
      exp_avg_step.push_back(-(lr * mu_nexts[i] / (1.0 - mu_product * mu_nexts[i])));
    }
    kiln::optim::sweep_chunks(
        {&b.params, &b.grads, &bucket_exp_avgs, &bucket_exp_avg_sqs},
        [&](const std::vector<std::vector<at::Tensor>>& l, const std::vector<size_t>& which) {
          const std::vector<at::Tensor>&ps = l[0], &exp_avg = l[2], &exp_avg_sq = l[3];
          const std::vector<at::Tensor> gs = decay_and_moments(
              {lr, wd, opt.beta1, opt.beta2, opt.decoupled}, ps, l[1], exp_avg, exp_avg_sq);
          std::vector<at::Tensor> denom = at::_foreach_sqrt(exp_avg_sq);
          at::_foreach_div_(denom, kiln::optim::chunk_scalars(bias_correction_sqrt, which));
          at::_foreach_add_(denom, opt.eps);
          at::_foreach_addcdiv_(ps, gs, denom, kiln::optim::chunk_scalars(grad_step, which));
          at::_foreach_addcdiv_(ps, exp_avg, denom,
                                kiln::optim::chunk_scalars(exp_avg_step, which));
        });
  }
}

kiln_status* nadam_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto opt = std::make_unique<NAdam>();
    opt->host = host;
    opt->beta1 = kiln_options_float(options, "beta1", 0.9);
    opt->beta2 = kiln_options_float(options, "beta2", 0.999);
    opt->eps = kiln_options_float(options, "eps", 1e-8);
    opt->momentum_decay = kiln_options_float(options, "momentum_decay", 4e-3);
    opt->decoupled = kiln_options_bool(options, "decoupled_weight_decay", 0) != 0;
    const double inf = HUGE_VAL;
    kiln::optim::check_range("nadam", "beta1", opt->beta1, 0.0, false, 1.0, true);
    kiln::optim::check_range("nadam", "beta2", opt->beta2, 0.0, false, 1.0, true);
    kiln::optim::check_range("nadam", "eps", opt->eps, 0.0, false, inf, false);
    kiln::optim::check_range("nadam", "momentum_decay", opt->momentum_decay, 0.0, false, inf,
                             false);
    *out = opt.release();
  });
}

void nadam_destroy(void* instance) { delete static_cast<NAdam*>(instance); }

kiln_status* nadam_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const NAdam& opt = *static_cast<const NAdam*>(instance);
  return KILN_GUARD(opt.host, { nadam_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(nadam_create, nadam_destroy, nadam_step);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_RANGE_INIT("beta1", KILN_OPT_FLOAT, 0.0, 1.0, "0.9",
                           "decay rate of the gradient average (exp_avg), in [0, 1)"),
    KILN_OPTION_RANGE_INIT("beta2", KILN_OPT_FLOAT, 0.0, 1.0, "0.999",
                           "decay rate of the squared-gradient average (exp_avg_sq), in [0, 1)"),
    KILN_OPTION_MIN_INIT("eps", KILN_OPT_FLOAT, 0.0, "1e-8",
                         "term added to the denominator for numerical stability, >= 0"),
    KILN_OPTION_MIN_INIT("momentum_decay", KILN_OPT_FLOAT, 0.0, "4e-3",
                         "warm-up rate of the momentum factor mu_t = beta1 (1 - 0.96^(t "
                         "momentum_decay) / 2), >= 0"),
    KILN_OPTION_INIT("decoupled_weight_decay", KILN_OPT_BOOL, "false",
                     "NAdamW: decay the weights directly (as AdamW) instead of adding the decay "
                     "to the gradient"),
};

const kiln_capabilities kCaps = KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps);

}  // namespace

const kiln_component_descriptor kNAdam = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "nadam", KILN_VERSION_INIT(1, 0, 0),
    "NAdam as torch.optim.NAdam (optionally NAdamW: decoupled_weight_decay)", &kCaps, kOptions,
    &kVtable);

}  // namespace kiln::adam_family
