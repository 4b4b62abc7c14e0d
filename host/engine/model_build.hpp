// Building the pipeline's model: its model plugin, with every norm layer it asks for made by the
// pipeline's norm plugin. One path for a run, `kiln validate`, `plan` and `lr-schedule`.
#pragma once

#include <c10/core/DeviceType.h>

#include <cstdint>
#include <memory>

#include "config/pipeline.hpp"
#include "kiln/model.h"

namespace kiln {
class Model;
}
namespace kiln::plugin {
class NormWindow;
}
namespace kiln::dist {
class ProcessGroup;
}

namespace kiln::engine {

// The model of `pipeline` for inputs `input`, in a run on `device` (the device type its norm
// plugin is told, kiln_norm_setup.device_type; the model is still built on the CPU) of
// `world_size` ranks (synced norm layers check their grouping against it). Throws
// plugin::OptionsRefused when the model or the norm plugin refuses its options,
// plugin::ComponentError for other failures, and PipelineError when the model asked for no norm
// layer while the pipeline chose its norm explicitly (a norm component other than the default, or a
// [norm] key set): those settings would do nothing. `window`: the run's window of micro-batches for
// norm.running_stats_update (norm_window_for), or nullptr. `group`: the run's process group, which
// the norm layers' collectives use (it must outlive the model); nullptr for a single process.
std::shared_ptr<kiln::Model> build_model(const config::Pipeline& pipeline,
                                         const kiln_model_input& input, c10::DeviceType device,
                                         int32_t world_size = 1,
                                         std::shared_ptr<plugin::NormWindow> window = nullptr,
                                         dist::ProcessGroup* group = nullptr);

// model.init (with model.init_skip) into `model` when it is set; a failure is a PipelineError
// at model.init.
void load_initial_weights(const config::Pipeline& pipeline, kiln::Model& model);

// The window a run's norm layers report their batch statistics to: under gradient accumulation
// with a norm.running_stats_update other than micro_batch; nullptr otherwise.
std::shared_ptr<plugin::NormWindow> norm_window_for(const config::Pipeline& pipeline);

// The input geometry the data section describes, without reading data: synthetic images as
// configured, Fashion-MNIST's 1×28×28 and 10 classes.
kiln_model_input described_input(const config::Pipeline& pipeline);

}  // namespace kiln::engine
