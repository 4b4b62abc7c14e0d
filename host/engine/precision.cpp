#include "engine/precision.hpp"

#include <ATen/autocast_mode.h>

#include "engine/checks.hpp"
#include "kiln/torch.hpp"

namespace kiln::engine {
namespace {

at::ScalarType to_scalar_type(int32_t dtype, const std::string& name, const char* field) {
  switch (dtype) {
    case KILN_DTYPE_F32:
      return at::kFloat;
    case KILN_DTYPE_F16:
      return at::kHalf;
    case KILN_DTYPE_BF16:
      return at::kBFloat16;
    default:
      throw PipelineError("precision.name", "precision '" + name + "' declares an unknown " +
                                                field + " (" + std::to_string(dtype) + ")");
  }
}

}  // namespace

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    default:
      return c10::toString(dtype);
  }
}

PrecisionPlan plan_precision(const kiln_precision_policy& policy, const std::string& name) {
  PrecisionPlan plan;
  plan.name = name;
  plan.model_dtype = to_scalar_type(policy.model_dtype, name, "model dtype");
  plan.autocast = policy.autocast != 0;
  plan.autocast_dtype =
      plan.autocast ? to_scalar_type(policy.compute_dtype, name, "compute dtype") : at::kFloat;
  plan.master_weights = policy.master_weights != 0;
  plan.norm_fp32 = policy.norm_fp32 != 0;
  plan.loss_scaling = policy.loss_scaling;
  plan.initial_scale = policy.loss_scaling == KILN_SCALE_NONE ? 1.0 : policy.initial_scale;
  plan.min_scale = policy.loss_scaling == KILN_SCALE_DYNAMIC ? policy.min_scale : 0.0;
  plan.stop_at_min_scale = policy.at_min_scale == KILN_AT_MIN_SCALE_STOP;

  const std::string who = "precision '" + name + "' ";
  if (plan.autocast && plan.autocast_dtype == at::kFloat) {
    throw PipelineError("precision.name",
                        who + "asks for autocast to float32, which changes nothing");
  }
  if (plan.autocast && plan.half_model()) {
    throw PipelineError("precision.name",
                        who + "asks for autocast on a " + dtype_name(plan.model_dtype) +
                            " model; autocast is for fp32 models (use one or the other)");
  }
  if (plan.master_weights && !plan.half_model()) {
    throw PipelineError("precision.name", who + "asks for fp32 master weights of an fp32 model");
  }
  if (policy.loss_scaling != KILN_SCALE_NONE && policy.loss_scaling != KILN_SCALE_STATIC &&
      policy.loss_scaling != KILN_SCALE_DYNAMIC) {
    throw PipelineError("precision.name", who + "declares an unknown loss-scaling mode (" +
                                              std::to_string(policy.loss_scaling) + ")");
  }
  if (!(plan.initial_scale > 0.0) || !std::isfinite(plan.initial_scale)) {
    throw PipelineError("precision.name", who + "declares an initial loss scale of " +
                                              std::to_string(plan.initial_scale) +
                                              " (must be finite, > 0)");
  }
  return plan;
}

void cast_model(torch::nn::Module& model, const PrecisionPlan& plan) {
  if (!plan.half_model()) return;
  // Module::to() recurses; norm layers must be skipped, so each module casts only what it holds
  // directly. set_data keeps the tensors' identities (and the modules' handles) valid.
  auto cast_own = [&](torch::nn::Module& module) {
    for (auto& p : module.parameters(/*recurse=*/false)) {
      if (p.is_floating_point()) p.set_data(p.to(plan.model_dtype));
    }
    for (auto& b : module.buffers(/*recurse=*/false)) {
      if (b.is_floating_point()) b.set_data(b.to(plan.model_dtype));
    }
  };
  cast_own(model);
  for (const auto& child : model.modules(/*include_self=*/false)) {
    const bool is_norm = dynamic_cast<kiln::NormLayer*>(child.get()) != nullptr;
    if (is_norm && plan.norm_fp32) continue;
    cast_own(*child);
  }
}

AutocastScope::AutocastScope(c10::DeviceType device, at::ScalarType dtype, bool enabled)
    : device_(device), enabled_(enabled) {
  if (!enabled_) return;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, dtype);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
}

}  // namespace kiln::engine
