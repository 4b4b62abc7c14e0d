// `kiln validate`: every component of a pipeline created the way a run creates it, then dropped,
// so that whatever a run would refuse before its first step is refused now, as a configuration
// error at the key that causes it.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "config/pipeline.hpp"

namespace kiln::engine {

// Checks `pipeline` for a run on `device` over `world_size` ranks: the cross-component checks,
// the training data (read as the run reads it), the precision plugin, the model with its norm
// layers and `model.init` weights, activation checkpointing, the parameter groups, the optimizer,
// the LR policy over the run's real schedule, and the loss scaler. Throws config::ConfigError
// ("file:line:column: key: reason") for a problem of the configuration; other exceptions (a
// plugin that throws) pass through. Returns what the data holds (describe_data).
std::string preflight(const config::Pipeline& pipeline, c10::Device device, int64_t world_size = 1);

}  // namespace kiln::engine
