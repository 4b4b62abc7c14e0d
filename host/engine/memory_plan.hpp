// `kiln plan`'s static memory estimate: what weights, gradients, fp32 master weights and optimizer
// state take under each precision mode, before a run allocates any of it. Activations are not
// included (they depend on batch size and checkpointing).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "config/pipeline.hpp"
#include "engine/param_groups.hpp"
#include "engine/precision.hpp"

namespace kiln::engine {

// Bytes per element and per tensor of the optimizer's state, measured by one dry step of the
// pipeline's optimizer on probe tensors (state that has a parameter's shape counts per element;
// anything else, e.g. a step counter, per tensor).
struct OptimizerStateCost {
  double bytes_per_element = 0.0;  // for float32 parameters; state follows the parameter dtype
  double bytes_per_tensor = 0.0;
};
OptimizerStateCost measure_optimizer_state(const config::Pipeline& pipeline);

struct MemoryEstimate {
  std::string mode;  // the plan's name: the precision plugin's, or a shape ("float32", "half")
  int64_t weights = 0, gradients = 0, master_weights = 0, optimizer_state = 0;
  int64_t ema = 0;  // [ema]'s average: every parameter and buffer, floating ones at least fp32
  int64_t total() const { return weights + gradients + master_weights + optimizer_state + ema; }
};

// The estimate for `model` (fp32, as built) trained with `plan`, the optimizer stepping the
// parameters in `groups`; with `ema`, the weights' moving average too.
MemoryEstimate estimate_memory(torch::nn::Module& model, const std::vector<ParamGroup>& groups,
                               const PrecisionPlan& plan, const OptimizerStateCost& state,
                               bool ema = false);

}  // namespace kiln::engine
