// Checks across the whole pipeline that need the chosen components, run before any data is read
// (by `kiln validate` and at the start of `kiln run`).
#pragma once

#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <stdexcept>
#include <string>

#include "config/pipeline.hpp"

namespace kiln::engine {

struct PrecisionPlan;

// A pipeline whose components cannot work together or on the chosen device. what() is the reason.
class PipelineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "cpu", "cuda" or "auto" (cuda when a device is present). Throws PipelineError for "cuda"
// without a CUDA device.
c10::Device resolve_device(const std::string& wanted);

// Refuses, with the reason, a component that cannot run on `device` with the dtypes the
// precision policy gives it (model, norm layers, optimizer), and a policy this host cannot carry
// out. Throws PipelineError.
void check_pipeline(const config::Pipeline& pipeline, c10::Device device);

// Checks that need the built model: half-precision batch-norm running statistics (O3 without
// keep_norm_fp32) are refused in float16, where the running variance loses its precision.
void check_model_precision(torch::nn::Module& model, const PrecisionPlan& plan);

}  // namespace kiln::engine
