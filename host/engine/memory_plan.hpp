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

// Bytes per element and per tensor of an optimizer's state, measured by one dry step of it on a
// probe tensor (state the size of the parameter, or of k parameters, counts per element;
// anything else, e.g. a step counter, per tensor). State that grows over the steps (LBFGS's
// history) counts as after the first step.
struct OptimizerStateCost {
  double bytes_per_element = 0.0;  // for float32 parameters; state follows the parameter dtype
  double bytes_per_tensor = 0.0;
};
// [optimizer]'s (with its inner one), then each [[optimizer.partition]]'s, in file order: the
// index a ParamGroup's `optimizer` names.
std::vector<OptimizerStateCost> measure_optimizer_state(const config::Pipeline& pipeline);

struct MemoryEstimate {
  std::string mode;  // the plan's name: the precision plugin's, or a shape ("float32", "half")
  int64_t weights = 0, gradients = 0, master_weights = 0, optimizer_state = 0;
  int64_t ema = 0;  // [ema]'s average: every parameter and buffer, floating ones at least fp32
  int64_t total() const { return weights + gradients + master_weights + optimizer_state + ema; }
};

// The estimate for `model` (fp32, as built) trained with `plan`, each group's optimizer (`state`
// indexed by ParamGroup::optimizer) stepping its parameters; with `ema`, the weights' moving
// average too.
MemoryEstimate estimate_memory(torch::nn::Module& model, const std::vector<ParamGroup>& groups,
                               const PrecisionPlan& plan,
                               const std::vector<OptimizerStateCost>& state, bool ema = false);

}  // namespace kiln::engine
