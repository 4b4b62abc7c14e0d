// What a precision policy means on this host: the dtypes the model is stored and run in, whether
// the optimizer steps fp32 master copies, and the loss-scaling plan; plus the two mechanics that
// act on the model directly (casting it, and the autocast region around forward and loss).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <torch/nn/module.h>

#include <string>

#include "kiln/precision.h"

namespace kiln::engine {

struct PrecisionPlan {
  std::string name;                         // the precision component
  at::ScalarType model_dtype = at::kFloat;  // parameters and buffers (norm layers aside)
  bool autocast = false;                    // forward and loss under autocast
  at::ScalarType autocast_dtype = at::kFloat;
  bool master_weights = false;  // the optimizer steps fp32 copies of half parameters
  bool norm_fp32 = true;        // norm layers stay fp32 in a half model
  int32_t loss_scaling = KILN_SCALE_NONE;
  double initial_scale = 1.0;
  double min_scale = 0.0;         // an overflow at or below it triggers stop_at_min_scale
  bool stop_at_min_scale = true;  // else skip and warn

  bool half_model() const { return model_dtype != at::kFloat; }
  // The dtype the optimizer's tensors are in (norm layers aside).
  at::ScalarType step_dtype() const { return master_weights ? at::kFloat : model_dtype; }
};

// The plan of `policy` from precision component `name`. Throws PipelineError for a policy this
// host cannot carry out (unknown dtype, master weights on an fp32 model, autocast to fp32, ...).
PrecisionPlan plan_precision(const kiln_precision_policy& policy, const std::string& name);

// "float32", "float16", "bfloat16".
std::string dtype_name(at::ScalarType dtype);

// Casts floating parameters and buffers to plan.model_dtype, leaving kiln::NormLayer modules
// (and what they hold) in fp32 when plan.norm_fp32. No-op for an fp32 model.
void cast_model(torch::nn::Module& model, const PrecisionPlan& plan);

// Autocast to `dtype` on `device` for the scope's lifetime, as Python's torch.autocast does:
// nested scopes share the weight-cast cache, cleared when the outermost one ends. Inactive when
// `enabled` is false.
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device, at::ScalarType dtype, bool enabled);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_;
  bool enabled_;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

}  // namespace kiln::engine
