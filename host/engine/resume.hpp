// A run's state for checkpoints: what the trainer captures after a step (weights, optimizer
// state, fp32 masters, RNG, LR schedule, loss scale, position) and restores to continue exactly;
// and which checkpoint a resume starts from.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "config/pipeline.hpp"
#include "engine/config_identity.hpp"
#include "engine/init_weights.hpp"  // load_weights, declared here before it moved
#include "engine/model_ema.hpp"
#include "engine/optimizer_side.hpp"
#include "engine/run_position.hpp"
#include "io/checkpoint.hpp"

namespace kiln::engine {

// "name version (library)" of each component slot.
std::map<std::string, std::string> plugin_versions(const config::Pipeline& pipeline);

// The state after a step: the model's tensors, the optimizer side's, the weights' average (when
// `ema` is not null), the RNGs and the position, with the configuration's keys and the plugins'
// versions.
io::CheckpointData capture(const RunPosition& position, torch::nn::Module& model,
                           const OptimizerSide& optimizer, const config::Pipeline& pipeline,
                           const ModelEma* ema = nullptr);

// Puts `data` back into the run's objects and returns the position to continue from. Throws
// io::CheckpointError when the checkpoint does not fit the model (names, shapes).
RunPosition restore(const io::CheckpointData& data, torch::nn::Module& model,
                    OptimizerSide& optimizer, c10::Device device);

// The checkpoint to resume from. `resume` is "auto" (the newest usable one under `root`) or a
// checkpoint folder. Unusable ones (corrupt, truncated, another configuration than
// `pipeline`'s, which is refused with the keys that differ) are refused with the reason in the
// log; with `fall_back` an older one is tried, else the refusal is thrown. Nothing is ever
// deleted here. nullopt: "auto" and no checkpoint exists yet.
std::optional<io::CheckpointData> choose_checkpoint(const std::string& resume,
                                                    const std::string& root,
                                                    const config::Pipeline& pipeline,
                                                    bool fall_back, std::string* chosen);

}  // namespace kiln::engine
