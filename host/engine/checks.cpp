#include "engine/checks.hpp"

#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>
#include <spdlog/spdlog.h>

#include <utility>
#include <vector>

#include "engine/lr_driver.hpp"
#include "engine/precision.hpp"
#include "kiln/torch.hpp"
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
    (void)schedule_frame(p, /*batches_per_epoch=*/1);
  } catch (const std::invalid_argument& e) {
    throw PipelineError(e.what());
  }
  const auto& checkpoint = p.memory.get_string_list("checkpoint");
  const bool checkpointing =
      !checkpoint.empty() && !(checkpoint.size() == 1 && checkpoint[0] == "none");
  if (checkpointing && p.dist.get_bool("find_unused_parameters")) {
    // The Reducer's graph walk cannot see inside a checkpointed segment, so it would call the
    // segment's parameters unused and then see their gradients arrive.
    throw PipelineError(
        "memory.checkpoint and dist.find_unused_parameters cannot be combined: the unused-"
        "parameter search cannot see inside checkpointed segments; turn one off");
  }
  plugin::PrecisionAdapter precision(*p.precision.component, p.precision.options, device.type());
  const PrecisionPlan plan = plan_precision(precision.policy(), precision.name());
  // The dtypes each component meets under this precision plan.
  const at::ScalarType compute = plan.autocast ? plan.autocast_dtype : plan.model_dtype;
  const std::vector<std::pair<const config::ComponentChoice*, std::vector<at::ScalarType>>> uses = {
      {&p.model, {plan.model_dtype, compute}},
      {&p.norm, {compute, plan.norm_fp32 ? at::kFloat : plan.model_dtype}},
      {&p.optimizer, {plan.step_dtype()}},
      {&p.precision, {at::kFloat}},
  };
  for (const auto& [choice, dtypes] : uses) {
    // LR policies compute scalars on the host, so their device bits say nothing about tensors.
    for (at::ScalarType dtype : dtypes) {
      std::string problem = plugin::capability_problem(*choice->component, device.type(), dtype);
      if (!problem.empty()) {
        throw PipelineError(problem + (plan.half_model() || plan.autocast
                                           ? " (needed by precision '" + plan.name + "')"
                                           : std::string()));
      }
    }
  }
}

void check_model_precision(torch::nn::Module& model, const PrecisionPlan& plan) {
  if (!plan.half_model() || plan.norm_fp32) return;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (dynamic_cast<kiln::NormLayer*>(item.value().get()) == nullptr) continue;
    if (item.value()->named_buffers(/*recurse=*/false).find("running_var") == nullptr) continue;
    throw PipelineError(
        "precision '" + plan.name + "' would keep the running statistics of norm layer '" +
        item.key() + "' in " + dtype_name(plan.model_dtype) +
        ", where the running variance loses its precision and batch norm diverges; set "
        "[precision] keep_norm_fp32 = true (apex keep_batchnorm_fp32), or use precision o2");
  }
}

}  // namespace kiln::engine
