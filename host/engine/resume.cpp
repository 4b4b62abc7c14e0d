#include "engine/resume.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace kiln::engine {
std::map<std::string, std::string> plugin_versions(const config::Pipeline& p) {
  std::map<std::string, std::string> out;
  for (const config::ComponentChoice* c :
       {&p.model, &p.norm, &p.optimizer, &p.lr_policy, &p.precision}) {
    const auto& v = c->component->descriptor->version;
    out[c->section] = fmt::format("{} {}.{}.{} ({})", c->component->name(), v.major, v.minor,
                                  v.patch, c->component->library_path);
  }
  return out;
}

io::CheckpointData capture(const RunPosition& position, torch::nn::Module& model,
                           const OptimizerSide& optimizer, const config::Pipeline& pipeline,
                           const ModelEma* ema) {
  io::CheckpointData data;
  io::CheckpointInfo& i = data.info;
  i.step = position.step;
  i.epoch = position.epoch;
  i.batches_in_epoch = position.batches_in_epoch;
  i.config_hash = config_hash(pipeline);
  i.config = config_identity(pipeline);
  i.plugins = plugin_versions(pipeline);
  for (const auto& item : model.named_parameters())
    data.model.emplace_back(item.key(), item.value());
  for (const auto& item : model.named_buffers()) data.model.emplace_back(item.key(), item.value());
  optimizer.state(data);
  if (ema != nullptr) ema->state(data);
  data.trainer.emplace_back("rng/cpu", at::detail::getDefaultCPUGenerator().get_state());
  if (at::hasCUDA()) {
    data.trainer.emplace_back(
        "rng/cuda", at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, 0)).get_state());
  }
  return data;
}

RunPosition restore(const io::CheckpointData& data, torch::nn::Module& model,
                    OptimizerSide& optimizer, c10::Device device) {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> saved(data.model.begin(), data.model.end());
  auto load_into = [&](const std::string& name, const at::Tensor& target) {
    const auto it = saved.find(name);
    if (it == saved.end()) throw io::CheckpointError("checkpoint has no tensor '" + name + "'");
    if (it->second.sizes() != target.sizes()) {
      throw io::CheckpointError("checkpoint tensor '" + name + "' has another shape");
    }
    target.copy_(it->second);
  };
  for (const auto& item : model.named_parameters()) load_into(item.key(), item.value());
  for (const auto& item : model.named_buffers()) load_into(item.key(), item.value());
  optimizer.restore(data, device);
  // Generators are handles: a copy sets the shared default generator's state.
  std::map<std::string, at::Tensor> trainer(data.trainer.begin(), data.trainer.end());
  if (const auto it = trainer.find("rng/cpu"); it != trainer.end()) {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    cpu.set_state(it->second);
  }
  if (const auto it = trainer.find("rng/cuda"); it != trainer.end() && at::hasCUDA()) {
    at::Generator cuda = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, 0));
    cuda.set_state(it->second);
  }
  return RunPosition{data.info.step, data.info.epoch, data.info.batches_in_epoch};
}

std::optional<io::CheckpointData> choose_checkpoint(const std::string& resume,
                                                    const std::string& root,
                                                    const config::Pipeline& pipeline,
                                                    bool fall_back, std::string* chosen) {
  const std::vector<std::string> candidates =
      resume == "auto" ? io::list_checkpoints(root) : std::vector<std::string>{resume};
  if (candidates.empty()) {
    spdlog::info("resume: no checkpoint under {}; starting from the beginning", root);
    return std::nullopt;
  }
  const std::string hash = config_hash(pipeline);
  const ConfigKeys keys = config_identity(pipeline);
  const ConfigKeys defaults = identity_defaults(pipeline);
  // What a refusal for the configuration adds: what may change, and the way to a new run from
  // the (newest refused) checkpoint's weights.
  std::string config_hint;
  auto refuse_config = [&](const std::string& dir, const std::string& why) {
    if (config_hint.empty())
      config_hint = fmt::format(
          "\n  only these keys may change on resume: {}.\n  To train the checkpoint's weights "
          "under this configuration, start a new run from them: kiln export {} --to "
          "weights.safetensors, then kiln run ... --set model.init=weights.safetensors",
          keys_free_on_resume(), dir);
    return io::CheckpointError(dir + ": written by another configuration: " + why);
  };
  for (const std::string& dir : candidates) {
    try {
      io::CheckpointData data = io::read_checkpoint(dir);
      // The recorded keys when there are (a hash alone cannot say what differs, and it covers
      // the pipeline file's path too); checkpoints from before them compare by the hash.
      if (!data.info.config.empty()) {
        const std::string differ = config_difference(data.info.config, keys, defaults);
        if (!differ.empty()) throw refuse_config(dir, differ);
      } else if (data.info.config_hash != hash) {
        throw refuse_config(dir, fmt::format("its configuration hash is {}, this run's {} (the "
                                             "checkpoint does not record its keys: written by an "
                                             "older Kiln, or from a pipeline file at another "
                                             "path)",
                                             data.info.config_hash, hash));
      }
      *chosen = dir;
      return data;
    } catch (const io::CheckpointError& e) {
      if (!fall_back || resume != "auto") throw io::CheckpointError(e.what() + config_hint);
      spdlog::error("resume: refused {}", e.what());
    }
  }
  throw io::CheckpointError("resume: no usable checkpoint under " + root +
                            " (each was refused above)" + config_hint);
}

}  // namespace kiln::engine
