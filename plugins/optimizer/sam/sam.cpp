// kiln_sam — "sam" and "asam": sharpness-aware minimisation as pytorch_optimizer.SAM (4.1.0)
// computes it, with adaptive = false and true. One call per step over every group (step_all,
// ABI 1.14): the weights move up the gradient to w + e(w), e = ρ g / (‖g‖ + ε) (ASAM: each
// element scaled by w², the norm of g·|w|); the host evaluates the loss and gradients there
// again (kiln_host_api.reevaluate: the same micro-batches, all-reduced, unscaled); the weights go
// back to w; and the inner optimizer ([optimizer.inner], any optimizer) steps with the new
// gradients (kiln_host_api.inner_step), its state kept by the host. A re-evaluation whose
// gradients are not finite leaves the weights and every state as they were.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_pow.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <memory>
#include <string>
#include <vector>

#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

using kiln::optim::Param;

struct Sam {
  const kiln_host_api* host;
  const char* name;  // "sam" or "asam"
  double rho;
  bool adaptive;
  double perturb_eps;
};

// The reference's get_global_gradient_norm(weight_adaptive): the float32 sum of squared norms of
// every gradient (times |w| when adaptive), then sqrt + ε.
at::Tensor global_norm(const Sam& opt, const std::vector<std::vector<Param>>& groups) {
  std::vector<at::Tensor> grads;
  for (const auto& params : groups) {
    for (const Param& p : params) {
      at::Tensor g = p.grad;
      if (opt.adaptive) {
        if (g.scalar_type() == at::kHalf || g.scalar_type() == at::kBFloat16) g = g.to(at::kFloat);
        g = g * p.param.abs();
      }
      grads.push_back(g);
    }
  }
  if (grads.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat));
  const at::Device device =
      groups.front().empty() ? grads.front().device() : groups.front().front().param.device();
  std::vector<at::Tensor> norms;
  const bool half =
      grads.front().scalar_type() == at::kHalf || grads.front().scalar_type() == at::kBFloat16;
  if (half) {
    for (const at::Tensor& g : grads) norms.push_back(g.to(at::kFloat).norm());
  } else {
    norms = at::_foreach_norm(grads);
  }
  for (at::Tensor& n : norms) n = n.to(device);
  at::Tensor squared = at::stack(norms).to(at::kFloat).square_();
  return squared.sum().reshape({1}).sqrt_().squeeze_(0).add_(opt.perturb_eps);
}

void sam_step(const Sam& opt, const kiln_optimizer_step_args* args) {
  if (args == nullptr || args->struct_size < KILN_SIZE_UP_TO(kiln_optimizer_step_args, loss) ||
      (args->group_count > 0 && (args->groups == nullptr || args->group_contexts == nullptr))) {
    kiln::optim::invalid(opt.name, "step_all called without groups");
  }
  std::vector<std::vector<Param>> groups;
  for (size_t g = 0; g < args->group_count; ++g) {
    groups.push_back(kiln::optim::read_group(opt.name, &args->groups[g]));
  }
  // First step: the ascent to w + e(w), the original weights kept for the way back.
  const at::Tensor grad_norm = global_norm(opt, groups);
  std::vector<std::vector<at::Tensor>> saved(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const Param& p : groups[g]) saved[g].push_back(p.param.clone());
    for (const auto& bucket : kiln::optim::by_device_and_dtype(groups[g])) {
      std::vector<at::Tensor> ps, gs;
      for (size_t i : bucket) {
        ps.push_back(groups[g][i].param);
        gs.push_back(groups[g][i].grad);
      }
      const at::Tensor scale = (opt.rho / grad_norm).to(ps.front());
      std::vector<at::Tensor> e;
      if (opt.adaptive) {
        e = at::_foreach_pow(ps, 2);
        at::_foreach_mul_(e, gs);
      } else {
        e = at::_foreach_mul(gs, 1.0);
      }
      at::_foreach_mul_(e, scale);
      at::_foreach_add_(ps, e);
    }
  }
  // The closure: the gradients at the perturbed weights, in the same memory.
  kiln_reevaluation found{};
  found.struct_size = sizeof(found);
  kiln::optim::check_host(opt.host, opt.host->reevaluate(args->ctx, &found));
  // Second step: back to w, and the inner optimizer's update with the new gradients.
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t k = 0; k < groups[g].size(); ++k) {
      at::Tensor param = groups[g][k].param;  // a handle: copy_ writes the parameter's memory
      param.copy_(saved[g][k]);
    }
  }
  if (found.finite == 0) return;
  for (size_t g = 0; g < args->group_count; ++g) {
    kiln::optim::check_host(opt.host,
                            opt.host->inner_step(args->group_contexts[g], &args->groups[g]));
  }
}

template <bool kAdaptive>
kiln_status* sam_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    if (!KILN_HAS_FIELD(host, kiln_host_api, inner_step)) {
      throw kiln::Error(KILN_ERR_UNSUPPORTED,
                        "sam: the host is older than Kiln ABI 1.14 (it "
                        "cannot evaluate the model again inside a step)");
    }
    auto opt = std::make_unique<Sam>();
    opt->host = host;
    opt->name = kAdaptive ? "asam" : "sam";
    opt->rho = kiln_options_float(options, "rho", kAdaptive ? 0.5 : 0.05);
    opt->adaptive = kiln_options_bool(options, "adaptive", kAdaptive ? 1 : 0) != 0;
    opt->perturb_eps = kiln_options_float(options, "perturb_eps", 1e-12);
    kiln::optim::check_range(opt->name, "rho", opt->rho, 0.0, false, HUGE_VAL, false);
    kiln::optim::check_range(opt->name, "perturb_eps", opt->perturb_eps, 0.0, false, HUGE_VAL,
                             false);
    *out = opt.release();
  });
}

void sam_destroy(void* instance) { delete static_cast<Sam*>(instance); }

kiln_status* sam_step_all(void* instance, const kiln_optimizer_step_args* args) {
  const Sam& opt = *static_cast<const Sam*>(instance);
  return KILN_GUARD(opt.host, { sam_step(opt, args); });
}

const kiln_optimizer_vtable kSamVtable =
    KILN_OPTIMIZER_VTABLE_FULL_INIT(sam_create<false>, sam_destroy, nullptr, nullptr, sam_step_all);
const kiln_optimizer_vtable kAsamVtable =
    KILN_OPTIMIZER_VTABLE_FULL_INIT(sam_create<true>, sam_destroy, nullptr, nullptr, sam_step_all);

const kiln_option_spec kSamOptions[] = {
    KILN_OPTION_MIN_INIT("rho", KILN_OPT_FLOAT, 0.0, "0.05",
                         "radius of the ascent step: e = rho g / (|g| + perturb_eps), >= 0"),
    KILN_OPTION_INIT("adaptive", KILN_OPT_BOOL, "false",
                     "ASAM: scale the ascent by w^2 and the norm by |w| (scale-invariant)"),
    KILN_OPTION_MIN_INIT("perturb_eps", KILN_OPT_FLOAT, 0.0, "1e-12",
                         "added to the gradient norm, >= 0"),
};
// ASAM's paper recommends a larger radius; adaptive on by default.
const kiln_option_spec kAsamOptions[] = {
    KILN_OPTION_MIN_INIT("rho", KILN_OPT_FLOAT, 0.0, "0.5",
                         "radius of the ascent step (ASAM's is larger than SAM's), >= 0"),
    KILN_OPTION_INIT("adaptive", KILN_OPT_BOOL, "true",
                     "scale the ascent by w^2 and the norm by |w| (false: plain SAM)"),
    KILN_OPTION_MIN_INIT("perturb_eps", KILN_OPT_FLOAT, 0.0, "1e-12",
                         "added to the gradient norm, >= 0"),
};

const kiln_capabilities kCaps =
    KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps | KILN_CAP_WRAPS_OPTIMIZER);

const kiln_component_descriptor kSam = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "sam", KILN_VERSION_INIT(1, 0, 0),
    "SAM as pytorch_optimizer.SAM: ascent, re-evaluation, then [optimizer.inner]'s step", &kCaps,
    kSamOptions, &kSamVtable);

const kiln_component_descriptor kAsam = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "asam", KILN_VERSION_INIT(1, 0, 0),
    "ASAM as pytorch_optimizer.SAM(adaptive=True): SAM with a scale-invariant ascent", &kCaps,
    kAsamOptions, &kAsamVtable);

const kiln_component_descriptor* const kComponents[] = {&kSam, &kAsam};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-sam", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
