#include "engine/checks.hpp"

#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <utility>
#include <vector>

#include "config/locate.hpp"
#include "engine/loss.hpp"
#include "engine/lr_driver.hpp"
#include "engine/precision.hpp"
#include "kiln/torch.hpp"
#include "plugin/adapters.hpp"
#include "plugin/registry.hpp"

namespace kiln::engine {

c10::Device resolve_device(const std::string& wanted) {
  const bool have_cuda = at::hasCUDA() && c10::cuda::device_count() > 0;
  if (wanted == "cuda" && !have_cuda) {
    throw PipelineError("run.device", "\"cuda\" but no CUDA device is available");
  }
  return (wanted == "cuda" || (wanted == "auto" && have_cuda)) ? c10::Device(c10::kCUDA, 0)
                                                               : c10::Device(c10::kCPU);
}

config::ConfigError located(const config::Pipeline& p, const PipelineError& problem) {
  return config::located_error(p, problem.key(), problem.what());
}

config::ConfigError located(const config::Pipeline& p, const plugin::OptionsRefused& refusal) {
  const config::ComponentChoice* choice = config::choice_of(p, refusal.section());
  // A norm layer refused while the model was being built: the model passes on the host's own
  // words, "norm '<name>' refused a layer …", and the fault is in [norm].
  if (refusal.section() == "model" && p.norm.component != nullptr &&
      refusal.reason().find("norm '" + std::string(p.norm.component->name()) + "' ") !=
          std::string::npos) {
    choice = &p.norm;
  }
  if (choice == nullptr) return config::ConfigError(refusal.what());
  return config::located_error(p, config::key_named_in(*choice, refusal.reason()), refusal.what());
}

void check_pipeline(const config::Pipeline& p, c10::Device device, int64_t world_size) {
  try {
    (void)schedule_frame(p, /*batches_per_epoch=*/1);
  } catch (const std::invalid_argument& e) {
    throw PipelineError("lr_policy.warmup_epochs", e.what());
  }
  if (p.settings.ema.decay >= 1.0) {
    throw PipelineError("ema.decay",
                        "must be below 1: at 1 the average never leaves the initial weights");
  }
  if (p.settings.run.early_stop_patience > 0 && p.settings.run.checkpoint_best == "none") {
    throw PipelineError(
        "run.early_stop_patience",
        "needs run.checkpoint_best (accuracy, top5, map or loss): the metric it watches");
  }
  if (const config::RunSettings& run = p.settings.run; run.checkpoint_best != "none") {
    if (!run.eval) {
      throw PipelineError("run.checkpoint_best",
                          "needs run.eval = true: the evaluations judge which checkpoint is best");
    }
    if (!run.checkpoints) {
      throw PipelineError("run.checkpoint_best", "needs run.checkpoints = true");
    }
  }
  if (!p.settings.run.eval && p.lr_policy.component != nullptr &&
      plugin::observes_evaluations(*p.lr_policy.component)) {
    throw PipelineError("lr_policy.name",
                        "'" + std::string(p.lr_policy.component->name()) +
                            "' reacts to evaluations and needs run.eval = true: without them "
                            "its rate would never change");
  }
  const int64_t batch = p.settings.data.batch_size;
  if (batch % world_size != 0) {
    throw PipelineError("data.batch_size",
                        fmt::format("{} is the global batch and must be a multiple of the world "
                                    "size {} (each rank takes batch_size / world size)",
                                    batch, world_size));
  }
  const auto& checkpoint = p.settings.memory.checkpoint;
  const bool checkpointing =
      !checkpoint.empty() && !(checkpoint.size() == 1 && checkpoint[0] == "none");
  if (checkpointing && p.settings.dist.find_unused_parameters) {
    // The Reducer's graph walk cannot see inside a checkpointed segment, so it would call the
    // segment's parameters unused and then see their gradients arrive.
    throw PipelineError(
        "memory.checkpoint",
        "memory.checkpoint and dist.find_unused_parameters cannot be combined: the unused-"
        "parameter search cannot see inside checkpointed segments; turn one off");
  }
  if (plugin::has_model_loss(*p.model.component)) {
    if (const std::string key = first_loss_key_set(p.settings.loss); !key.empty()) {
      throw PipelineError(key, fmt::format("model '{}' computes its own loss (its plugin's loss "
                                           "slot); [loss] keys keep their defaults with it",
                                           p.model.component->name()));
    }
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
        throw PipelineError(choice->section + ".name",
                            problem + (plan.half_model() || plan.autocast
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
        "precision.name",
        "precision '" + plan.name + "' would keep the running statistics of norm layer '" +
            item.key() + "' in " + dtype_name(plan.model_dtype) +
            ", where the running variance loses its precision and batch norm diverges; set "
            "[precision] keep_norm_fp32 = true (apex keep_batchnorm_fp32), or use precision o2");
  }
}

}  // namespace kiln::engine
