// `kiln plan`: the resolved pipeline as a person reads it — plugins with their libraries, every
// option with defaults filled, the parameter groups of the built model, the batch sizes and the
// schedule's length.
#pragma once

#include <memory>
#include <string>

#include "config/pipeline.hpp"

namespace kiln {
class Model;
}

namespace kiln::engine {

// Builds the model on the CPU to list its parameter groups; the training set's length is read
// (lr_schedule.hpp) for the schedule's, and where it cannot be the plan says why.
std::string describe_plan(const config::Pipeline& pipeline);

// The pipeline's model built on the CPU with its norm plugin, for inspection (no data read; the
// input geometry comes from the data section). The norm plugin is told the device run.device
// resolves to (kiln_norm_setup.device_type), so its layers are those the run would have.
std::shared_ptr<kiln::Model> build_model_for_inspection(const config::Pipeline& pipeline);

}  // namespace kiln::engine
