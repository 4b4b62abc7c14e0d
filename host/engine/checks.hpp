// Checks across the whole pipeline that need the chosen components, run before any data is read
// (by `kiln validate` and at the start of `kiln run`).
#pragma once

#include <c10/core/Device.h>

#include <stdexcept>
#include <string>

#include "config/pipeline.hpp"

namespace kiln::engine {

// A pipeline whose components cannot work together or on the chosen device. what() is the reason.
class PipelineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "cpu", "cuda" or "auto" (cuda when a device is present). Throws PipelineError for "cuda"
// without a CUDA device.
c10::Device resolve_device(const std::string& wanted);

// Refuses a component that cannot run on `device` in fp32, and a precision policy this host does
// not implement, with the reason. Throws PipelineError.
void check_pipeline(const config::Pipeline& pipeline, c10::Device device);

}  // namespace kiln::engine
