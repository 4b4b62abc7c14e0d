// kiln_schedulefree — "sgd_schedulefree" and "adamw_schedulefree": SGDScheduleFree and
// AdamWScheduleFree of the schedulefree package (1.4.1, its foreach path), which replace the
// learning-rate schedule by an average of the iterates. The model holds y, where gradients are
// taken (the package's train mode); evaluation sees x = y + (1 - 1/β)(z - y), which the plugin
// gives through eval_weights (ABI 1.14) without touching y, so training continues bit for bit.
// State per parameter, under the package's names: "z" (and AdamW's "exp_avg_sq"); the
// package's per-group scalars lr_max and weight_sum are kept per parameter as float64 scalars.
// The package's warm-up (warmup_steps) is its own: pair it with lr_policy "constant".
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/lerp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/chunked.hpp"
#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

using kiln::optim::Param;

struct ScheduleFree {
  const kiln_host_api* host;
  const char* name;  // "sgd_schedulefree" or "adamw_schedulefree"
  bool adam;
  double beta1;  // SGD's momentum, AdamW's betas[0]
  double beta2;  // AdamW only
  double eps;    // AdamW only
  int64_t warmup_steps;
  double r;
  double weight_lr_power;
};

// The package's interpolation weight c_{k+1} for step k (0-based) at `lr`, advancing the
// running lr_max and weight_sum kept in `lr_max` and `weight_sum` (0-dim float64).
double next_ckp1(const ScheduleFree& opt, int64_t k, double lr, const at::Tensor& lr_max,
                 const at::Tensor& weight_sum) {
  double* max = lr_max.data_ptr<double>();
  double* sum = weight_sum.data_ptr<double>();
  *max = std::max(lr, *max);
  const double weight =
      std::pow(static_cast<double>(k + 1), opt.r) * std::pow(*max, opt.weight_lr_power);
  *sum += weight;
  return *sum != 0.0 ? weight / *sum : 0.0;
}

void schedulefree_update(const ScheduleFree& opt, kiln_call_context* ctx,
                         const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group(opt.name, group);
  if (params.empty()) return;
  const kiln::optim::StateStore state(opt.host, ctx);
  const int64_t k = group->step - 1;  // the package's group['k'] before this step
  const double sched = k < opt.warmup_steps
                           ? static_cast<double>(k + 1) / static_cast<double>(opt.warmup_steps)
                           : 1.0;
  const double lr = group->lr * sched;
  // All state first, so that a host failure leaves every parameter untouched.
  std::vector<at::Tensor> z(params.size()), v(params.size()), lr_max(params.size()),
      weight_sum(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    bool created = false;
    z[i] = state.get(params[i], "z", KILN_STATE_ZEROS_LIKE_PARAM, &created);
    if (created) z[i].copy_(params[i].param);  // z starts at the weights
    if (opt.adam) v[i] = state.get(params[i], "exp_avg_sq", KILN_STATE_ZEROS_LIKE_PARAM);
    lr_max[i] = state.get(params[i], "lr_max", KILN_STATE_SCALAR_F64);
    weight_sum[i] = state.get(params[i], "weight_sum", KILN_STATE_SCALAR_F64);
  }
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    std::vector<at::Tensor> y, g, zs, vs;
    for (size_t i : bucket) {
      y.push_back(params[i].param);
      g.push_back(params[i].grad);
      zs.push_back(z[i]);
      if (opt.adam) vs.push_back(v[i]);
    }
    // The group's scalars, advanced once per parameter from the same values.
    double ckp1 = 0.0;
    for (size_t i : bucket) ckp1 = next_ckp1(opt, k, lr, lr_max[i], weight_sum[i]);
    // Gradients are the host's (read only): the package's in-place updates of them go to a copy.
    // Element-wise, in cache-sized chunks (common/chunked.hpp).
    const double bias_correction2 = 1.0 - std::pow(opt.beta2, static_cast<double>(k + 1));
    std::vector<std::vector<at::Tensor>*> lists{&y, &g, &zs};
    if (opt.adam) lists.push_back(&vs);
    kiln::optim::sweep_chunks(
        lists, [&](const std::vector<std::vector<at::Tensor>>& l, const std::vector<size_t>&) {
          const std::vector<at::Tensor>&cy = l[0], &cg = l[1], &cz = l[2];
          std::vector<at::Tensor> step_dir;
          if (opt.adam) {
            const std::vector<at::Tensor>& cv = l[3];
            at::_foreach_mul_(cv, opt.beta2);
            at::_foreach_addcmul_(cv, cg, cg, 1.0 - opt.beta2);
            std::vector<at::Tensor> denom = at::_foreach_div(cv, bias_correction2);
            at::_foreach_sqrt_(denom);
            at::_foreach_add_(denom, opt.eps);
            step_dir = at::_foreach_div(cg, denom);
            if (group->weight_decay != 0.0) at::_foreach_add_(step_dir, cy, group->weight_decay);
          } else if (group->weight_decay != 0.0) {
            step_dir = at::_foreach_add(cg, cy, group->weight_decay);
          } else {
            step_dir = cg;  // only read below
          }
          // y moves towards z and along the gradient; z takes the plain step.
          at::_foreach_lerp_(cy, cz, ckp1);
          at::_foreach_add_(cy, step_dir, lr * (opt.beta1 * (1.0 - ckp1) - 1.0));
          at::_foreach_sub_(cz, step_dir, lr);
        });
  }
}

// x = y.lerp(z, 1 - 1/β), as the package's eval() computes it in place.
void schedulefree_eval(const ScheduleFree& opt, kiln_call_context* ctx,
                       const kiln_param_group* group, const DLTensor* out) {
  if (group == nullptr || out == nullptr || (group->count > 0 && group->params == nullptr)) {
    kiln::optim::invalid(opt.name, "eval_weights called without parameters or outputs");
  }
  const kiln::optim::StateStore state(opt.host, ctx);
  for (size_t i = 0; i < group->count; ++i) {
    const at::Tensor y = kiln::as_tensor(group->params[i]);
    at::Tensor x = kiln::as_tensor(out[i]);
    if (x.sizes() != y.sizes()) kiln::optim::invalid(opt.name, "an output differs in shape");
    if (y.numel() == 0) continue;
    const Param p{i, y, at::Tensor()};
    bool created = false;
    const at::Tensor z = state.get(p, "z", KILN_STATE_ZEROS_LIKE_PARAM, &created);
    if (created) z.copy_(y);  // never stepped: x = y
    x.copy_(at::lerp(y, z, 1.0 - 1.0 / opt.beta1));
  }
}

template <bool kAdam>
kiln_status* schedulefree_create(const kiln_host_api* host, const kiln_options* options,
                                 void** out) {
  return KILN_GUARD(host, {
    auto opt = std::make_unique<ScheduleFree>();
    opt->host = host;
    opt->adam = kAdam;
    opt->name = kAdam ? "adamw_schedulefree" : "sgd_schedulefree";
    opt->beta1 = kAdam ? kiln_options_float(options, "beta1", 0.9)
                       : kiln_options_float(options, "momentum", 0.9);
    opt->beta2 = kiln_options_float(options, "beta2", 0.999);
    opt->eps = kiln_options_float(options, "eps", 1e-8);
    opt->warmup_steps = kiln_options_int(options, "warmup_steps", 0);
    opt->r = kiln_options_float(options, "r", 0.0);
    opt->weight_lr_power = kiln_options_float(options, "weight_lr_power", 2.0);
    // β = 0 would make x infinitely far from y (1 - 1/β).
    kiln::optim::check_range(opt->name, kAdam ? "beta1" : "momentum", opt->beta1, 0.0, true, 1.0,
                             true);
    kiln::optim::check_range(opt->name, "beta2", opt->beta2, 0.0, false, 1.0, true);
    kiln::optim::check_range(opt->name, "eps", opt->eps, 0.0, false, HUGE_VAL, false);
    *out = opt.release();
  });
}

void schedulefree_destroy(void* instance) { delete static_cast<ScheduleFree*>(instance); }

kiln_status* schedulefree_step(void* instance, kiln_call_context* ctx,
                               const kiln_param_group* group) {
  const ScheduleFree& opt = *static_cast<const ScheduleFree*>(instance);
  return KILN_GUARD(opt.host, { schedulefree_update(opt, ctx, group); });
}

kiln_status* schedulefree_eval_weights(void* instance, kiln_call_context* ctx,
                                       const kiln_param_group* group, const DLTensor* out) {
  const ScheduleFree& opt = *static_cast<const ScheduleFree*>(instance);
  return KILN_GUARD(opt.host, { schedulefree_eval(opt, ctx, group, out); });
}

const kiln_optimizer_vtable kSgdVtable =
    KILN_OPTIMIZER_VTABLE_FULL_INIT(schedulefree_create<false>, schedulefree_destroy,
                                    schedulefree_step, schedulefree_eval_weights, nullptr);
const kiln_optimizer_vtable kAdamWVtable =
    KILN_OPTIMIZER_VTABLE_FULL_INIT(schedulefree_create<true>, schedulefree_destroy,
                                    schedulefree_step, schedulefree_eval_weights, nullptr);

#define KILN_SF_COMMON_OPTIONS                                                               \
  KILN_OPTION_MIN_INIT("warmup_steps", KILN_OPT_INT, 0.0, "0",                               \
                       "linear warm-up of the lr over this many steps (the package's own)"), \
      KILN_OPTION_INIT("r", KILN_OPT_FLOAT, "0.0",                                           \
                       "weight of step k in the average grows as (k + 1)^r"),                \
      KILN_OPTION_INIT("weight_lr_power", KILN_OPT_FLOAT, "2.0",                             \
                       "weight of a step in the average grows as lr_max^weight_lr_power")

const kiln_option_spec kSgdOptions[] = {
    KILN_OPTION_RANGE_INIT("momentum", KILN_OPT_FLOAT, 0.0, 1.0, "0.9",
                           "interpolation β between y and z, in (0, 1); x = y + (1 - 1/β)(z - y)"),
    KILN_SF_COMMON_OPTIONS};

const kiln_option_spec kAdamWOptions[] = {
    KILN_OPTION_RANGE_INIT("beta1", KILN_OPT_FLOAT, 0.0, 1.0, "0.9",
                           "interpolation β between y and z, in (0, 1); x = y + (1 - 1/β)(z - y)"),
    KILN_OPTION_RANGE_INIT("beta2", KILN_OPT_FLOAT, 0.0, 1.0, "0.999",
                           "decay rate of the squared-gradient average (exp_avg_sq), in [0, 1)"),
    KILN_OPTION_MIN_INIT("eps", KILN_OPT_FLOAT, 0.0, "1e-8",
                         "term added to the denominator for numerical stability, >= 0"),
    KILN_SF_COMMON_OPTIONS};

const kiln_capabilities kCaps = KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps);

const kiln_component_descriptor kSgd = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "sgd_schedulefree", KILN_VERSION_INIT(1, 0, 0),
    "Schedule-Free SGD as schedulefree.SGDScheduleFree (evaluates at x; use lr_policy constant)",
    &kCaps, kSgdOptions, &kSgdVtable);

const kiln_component_descriptor kAdamW = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "adamw_schedulefree", KILN_VERSION_INIT(1, 0, 0),
    "Schedule-Free AdamW as schedulefree.AdamWScheduleFree (evaluates at x; use lr_policy "
    "constant)",
    &kCaps, kAdamWOptions, &kAdamWVtable);

const kiln_component_descriptor* const kComponents[] = {&kSgd, &kAdamW};

const kiln_plugin_descriptor kDescriptor = KILN_PLUGIN_DESCRIPTOR_INIT(
    "kiln-schedulefree", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
