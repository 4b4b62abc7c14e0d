// Checks across the whole pipeline that need the chosen components, run before any data is read
// (by `kiln validate` and at the start of `kiln run`).
#pragma once

#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "config/pipeline.hpp"
#include "plugin/status.hpp"

namespace kiln::engine {

struct PrecisionPlan;

// A pipeline whose components cannot work together or on the chosen device. what() is the
// reason; key() the "section.key" it concerns, where the configuration error points
// (as_config_errors).
class PipelineError : public std::runtime_error {
 public:
  PipelineError(std::string key, const std::string& reason)
      : std::runtime_error(reason), key_(std::move(key)) {}
  const std::string& key() const noexcept { return key_; }

 private:
  std::string key_;
};

// `problem` (a PipelineError or a component's plugin::OptionsRefused, the exception in flight
// when called from a catch block) as the configuration error it is: "file:line:column: key:
// reason", pointing at the key that caused it.
config::ConfigError located(const config::Pipeline& pipeline, const PipelineError& problem);
config::ConfigError located(const config::Pipeline& pipeline,
                            const plugin::OptionsRefused& refusal);

// Runs `f`; a PipelineError or a component's refusal of its options leaves it as a located
// config::ConfigError, so every caller reports them alike (exit 2, KILN_ERR_CONFIG).
template <typename F>
auto as_config_errors(const config::Pipeline& pipeline, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const PipelineError& e) {
    throw located(pipeline, e);
  } catch (const plugin::OptionsRefused& e) {
    throw located(pipeline, e);
  }
}

// "cpu", "cuda" or "auto" (cuda when a device is present). Throws PipelineError for "cuda"
// without a CUDA device.
c10::Device resolve_device(const std::string& wanted);

// Refuses, with the reason, a component that cannot run on `device` with the dtypes the
// precision policy gives it (model, norm layers, optimizer), and a policy this host cannot carry
// out, and a global batch the `world_size` ranks of data parallelism do not divide. Throws
// PipelineError.
void check_pipeline(const config::Pipeline& pipeline, c10::Device device, int64_t world_size = 1);

// Checks that need the built model: half-precision batch-norm running statistics (O3 without
// keep_norm_fp32) are refused in float16, where the running variance loses its precision.
void check_model_precision(torch::nn::Module& model, const PrecisionPlan& plan);

}  // namespace kiln::engine
