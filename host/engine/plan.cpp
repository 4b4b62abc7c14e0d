#include "engine/plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/activation_checkpoint.hpp"
#include "engine/checks.hpp"
#include "engine/lr_driver.hpp"
#include "engine/lr_schedule.hpp"
#include "engine/memory_plan.hpp"
#include "engine/model_build.hpp"
#include "engine/param_groups.hpp"
#include "engine/precision.hpp"
#include "kiln/torch.hpp"
#include "plugin/adapters.hpp"
#include "plugin/host_api.hpp"
#include "plugin/norm_layer.hpp"
#include "plugin/registry.hpp"

namespace kiln::engine {

std::shared_ptr<kiln::Model> build_model_for_inspection(const config::Pipeline& p) {
  // The norm plugin is told the device the run would train on (it may choose its layout by it):
  // run.device as a run resolves it, and "cuda" even on a machine without one, whose run would
  // not start but whose schedule or groups can still be looked at.
  const std::string& wanted = p.settings.run.device;
  const c10::DeviceType device = wanted == "cuda" ? c10::kCUDA : resolve_device(wanted).type();
  return build_model(p, described_input(p), device);
}

namespace {

std::string mib(int64_t bytes) {
  return fmt::format("{:.3f}", static_cast<double>(bytes) / 1048576.0);
}

// "adamw", or "adamw + muon" with a partition: the optimizers whose state the table counts.
std::string optimizer_names(const config::Pipeline& p) {
  std::string names(p.optimizer.component->name());
  for (const config::OptimizerPartition& part : p.partitions) {
    names += " + ";
    names += part.optimizer.component->name();
  }
  return names;
}

// Static memory of the pipeline's precision and, for comparison, of the three shapes a precision
// plan can take (a float32 model, a half model with float32 masters, a half model alone). The
// rows are named by what they hold, not by plugins: any precision plugin yields one of them.

std::string memory_table(const config::Pipeline& p, torch::nn::Module& model,
                         const std::vector<ParamGroup>& groups) {
  const c10::Device device = resolve_device(p.settings.run.device);
  plugin::PrecisionAdapter precision(*p.precision.component, p.precision.options, device.type());
  const PrecisionPlan chosen = plan_precision(precision.policy(), precision.name());
  const at::ScalarType half = device.is_cuda() ? at::kHalf : at::kBFloat16;
  std::vector<PrecisionPlan> plans = {chosen};
  auto shape = [&](const char* label, bool half_model, bool masters) {
    if (chosen.half_model() == half_model && chosen.master_weights == masters) return;
    PrecisionPlan plan;
    plan.name = label;
    plan.model_dtype = half_model ? half : at::kFloat;
    plan.master_weights = masters;
    plan.norm_fp32 = true;
    plans.push_back(plan);
  };
  shape("float32", false, false);
  shape("half+master", true, true);
  shape("half", true, false);
  const std::vector<OptimizerStateCost> state = measure_optimizer_state(p);
  const bool ema = p.settings.ema.decay > 0;
  // The ema column only where [ema] is on: the table of other pipelines stays as it was.
  std::string out = fmt::format(
      "# static memory in MiB with optimizer {} (activations, and under autocast the half "
      "copies of weights, come on top)\n#   {:<12} {:>9} {:>9} {:>9} {:>9} {}{:>9}\n",
      optimizer_names(p), "precision", "weights", "grads", "masters", "optimizer",
      ema ? fmt::format("{:>9} ", "ema") : "", "total");
  for (size_t i = 0; i < plans.size(); ++i) {
    const MemoryEstimate e = estimate_memory(model, groups, plans[i], state, ema);
    out +=
        fmt::format("# {} {:<12} {:>9} {:>9} {:>9} {:>9} {}{:>9}\n", i == 0 ? '*' : ' ', e.mode,
                    mib(e.weights), mib(e.gradients), mib(e.master_weights), mib(e.optimizer_state),
                    ema ? fmt::format("{:>9} ", mib(e.ema)) : "", mib(e.total()));
  }
  return out;
}

// The frame's length in optimizer steps and its warm-up, as `kiln lr-schedule` lists them.
std::string describe_schedule(const ScheduleFrame& f, const std::string& epoch_unknown) {
  if (!epoch_unknown.empty()) {
    return "# schedule: epoch length unknown (" + epoch_unknown + ")\n";
  }
  std::string out = fmt::format(
      "# schedule: {} optimizer steps, {} per epoch ({} batches{})", f.max_iters, f.iters_per_epoch,
      f.batches_per_epoch,
      f.accumulation > 1 ? fmt::format(" in windows of {}", f.accumulation) : std::string());
  if (f.warmup != Warmup::kNone) {
    out += fmt::format("; {} warm-up over steps 1-{}", warmup_name(f.warmup), f.warmup_iters);
  }
  return out + "\n";
}

}  // namespace

std::string describe_plan(const config::Pipeline& p) {
  std::string out = "# resolved pipeline: " + p.path + "\n";
  for (const config::ComponentChoice* c :
       {&p.model, &p.norm, &p.optimizer, &p.lr_policy, &p.precision}) {
    const auto& v = c->component->descriptor->version;
    out += fmt::format("# {:<10} {} {}.{}.{}  ({})\n", c->section, c->component->name(), v.major,
                       v.minor, v.patch, c->component->library_path);
  }
  out += "\n" + config::to_toml(p) + "\n";

  std::shared_ptr<kiln::Model> model = build_model_for_inspection(p);
  // The run's frame (lr_driver.hpp); the epoch length needs the dataset's size, the rest not.
  std::string epoch_unknown;
  int64_t batches = 1;
  try {
    batches = train_batches_per_epoch(p);
  } catch (const std::exception& e) {
    epoch_unknown = e.what();
  }
  const ScheduleFrame frame = schedule_frame(p, batches);
  out += "# parameter groups (lr = schedule lr x scale; base lr " +
         fmt::format("{}", frame.base_lr) +
         (frame.base_lr != frame.unscaled_lr ? ", linearly scaled" : "") + ")\n";
  int64_t total = 0;
  const GroupRules rules = group_rules(p);
  const std::vector<ParamGroup> groups = build_param_groups(*model, rules);
  for (const ParamGroup& g : groups) {
    int64_t elements = 0;
    for (const auto& t : g.params) elements += t.numel();
    total += elements;
    out += fmt::format(
        "#   {:<10} {} tensors, {} elements, lr {} (x{}), weight_decay {}{}\n", g.name,
        g.params.size(), elements, frame.base_lr * g.lr_scale, g.lr_scale, g.weight_decay,
        rules.partitions.empty() ? std::string()
                                 : ", optimizer " + rules.optimizer_names.at(g.optimizer));
  }
  // Which optimizer steps which parameter, when more than one does.
  if (!rules.partitions.empty()) {
    out += "# parameters by optimizer:\n";
    for (const ParamGroup& g : groups) {
      for (size_t i = 0; i < g.names.size(); ++i) {
        out +=
            fmt::format("#   {} {} -> {} ({})\n", g.names[i], fmt::join(g.params[i].sizes(), "x"),
                        rules.optimizer_names.at(g.optimizer), g.name);
      }
    }
  }
  out += fmt::format("# trainable parameters: {}\n", total);
  out += fmt::format(
      "# batch: {} per step = batch_size {} (global: split over the ranks of a distributed run) "
      "x accumulation {}\n",
      frame.effective_batch, frame.micro_batch, frame.accumulation);
  out += describe_schedule(frame, epoch_unknown);
  // A policy that reacts to evaluations has no fixed schedule to show (kiln lr-schedule).
  if (plugin::observes_evaluations(*p.lr_policy.component)) {
    out += "# lr_policy " + std::string(p.lr_policy.component->name()) +
           " reacts to evaluations: the rate after warm-up follows them (kiln lr-schedule "
           "--metrics run.jsonl replays a run's)\n";
  }
  const std::vector<std::string> blocks = model->block_names();
  out += blocks.empty()
             ? std::string("# blocks for memory.checkpoint: none (the model has no chains)\n")
             : fmt::format("# blocks for memory.checkpoint: {}\n", fmt::join(blocks, ", "));
  const std::string checkpointing = apply_activation_checkpointing(
      *model, p.settings.memory.checkpoint, std::string(p.model.component->name()));
  if (!checkpointing.empty()) out += "# activation checkpointing: " + checkpointing + "\n";
  out += memory_table(p, *model, groups);
  return out;
}

}  // namespace kiln::engine
