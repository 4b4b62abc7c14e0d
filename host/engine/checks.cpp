#include "engine/checks.hpp"

#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>

#include "engine/lr_driver.hpp"
#include "plugin/adapters.hpp"

namespace kiln::engine {

c10::Device resolve_device(const std::string& wanted) {
  const bool have_cuda = at::hasCUDA() && c10::cuda::device_count() > 0;
  if (wanted == "cuda" && !have_cuda) {
    throw PipelineError("run.device = \"cuda\" but no CUDA device is available");
  }
  return (wanted == "cuda" || (wanted == "auto" && have_cuda)) ? c10::Device(c10::kCUDA, 0)
                                                               : c10::Device(c10::kCPU);
}

void check_pipeline(const config::Pipeline& p, c10::Device device) {
  try {
    (void)schedule_frame(p, /*iters_per_epoch=*/1);
  } catch (const std::invalid_argument& e) {
    throw PipelineError(e.what());
  }
  for (const config::ComponentChoice* choice : {&p.model, &p.norm, &p.optimizer, &p.precision}) {
    // LR policies compute scalars on the host, so their device bits say nothing about tensors.
    std::string problem = plugin::capability_problem(*choice->component, device.type(), at::kFloat);
    if (!problem.empty()) throw PipelineError(problem);
  }
  plugin::PrecisionAdapter precision(*p.precision.component, p.precision.options, device.type());
  const kiln_precision_policy& policy = precision.policy();
  if (policy.model_dtype != KILN_DTYPE_F32 || policy.autocast ||
      policy.loss_scaling != KILN_SCALE_NONE) {
    throw PipelineError("precision '" + precision.name() +
                        "' asks for half-precision weights, autocast or loss scaling, which this "
                        "host version does not provide; use precision.name = \"fp32\"");
  }
}

}  // namespace kiln::engine
