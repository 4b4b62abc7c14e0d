#include "engine/optimizer_side.hpp"

#include <ATen/ops/empty_like.h>

#include <map>
#include <string>

namespace kiln::engine {

namespace {

ClipSettings clip_settings(const config::OptimizerSettings& o) {
  ClipSettings clip;
  clip.max_norm = o.clip_grad_norm;
  clip.norm_type = o.clip_norm_type;
  clip.max_value = o.clip_grad_value;
  return clip;
}

std::vector<plugin::OptimizerAdapter*> pointers(
    const std::vector<std::unique_ptr<plugin::OptimizerAdapter>>& optimizers) {
  std::vector<plugin::OptimizerAdapter*> out;
  for (const auto& o : optimizers) out.push_back(o.get());
  return out;
}

constexpr const char* kInnerPrefix = "inner.";

}  // namespace

std::vector<std::unique_ptr<plugin::OptimizerAdapter>> make_optimizers(const config::Pipeline& p,
                                                                       dist::ProcessGroup* group) {
  std::vector<std::unique_ptr<plugin::OptimizerAdapter>> out;
  const config::ComponentChoice& inner = p.inner_optimizer;
  out.push_back(std::make_unique<plugin::OptimizerAdapter>(
      *p.optimizer.component, p.optimizer.options, group, inner.component,
      inner.component != nullptr ? &inner.options : nullptr));
  for (const config::OptimizerPartition& part : p.partitions) {
    out.push_back(std::make_unique<plugin::OptimizerAdapter>(*part.optimizer.component,
                                                             part.optimizer.options, group));
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> saved_eval_weights(const io::CheckpointData& data) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const std::string prefix = kEvalPrefix;
  for (const auto& [key, t] : data.trainer) {
    if (key.rfind(prefix, 0) == 0) out.emplace_back(key.substr(prefix.size()), t);
  }
  return out;
}

OptimizerSide::OptimizerSide(const config::Pipeline& p, torch::nn::Module& model,
                             const PrecisionPlan& plan, plugin::PrecisionAdapter& precision,
                             const ScheduleFrame& frame, dist::ProcessGroup* group)
    : groups_(build_param_groups(model, group_rules(p))),
      optimizers_(make_optimizers(p, group)),
      lr_policy_(*p.lr_policy.component, p.lr_policy.options, to_policy_schedule(frame)),
      lr_(frame, lr_policy_),
      scaler_(plan, precision, p.settings.run.max_nonfinite_steps),
      clip_(clip_settings(p.settings.optimizer)),
      updates_(groups_, plan, pointers(optimizers_), scaler_, lr_, clip_, group) {}

StepOutcome OptimizerSide::step(int64_t step, const WindowResult& w, bool check_gradients) {
  updates_.set_window(w.micro_batches, w.samples);
  if (w.update_ran) return updates_.after_device_update(step, *w.check);
  if (w.check) return updates_.run_after_check(step, *w.check);
  return updates_.run(step, w.loss, check_gradients);
}

std::vector<std::string> OptimizerSide::group_names() const {
  std::vector<std::string> names;
  for (const ParamGroup& g : groups_) names.push_back(g.name);
  return names;
}

void OptimizerSide::observe(const io::EvalRecord& record) {
  if (!lr_policy_.observes()) return;
  lr_policy_.observe(lr_.counted(), record.epoch,
                     observed_metrics(record.loss, record.accuracy, record.accuracy_top5,
                                      record.multi_label, record.map));
}

void OptimizerSide::state(io::CheckpointData& out) const {
  io::CheckpointInfo& i = out.info;
  i.lr_counted = lr_.counted();
  i.lr_state = lr_policy_.state();
  const LossScaler::State s = scaler_.state();
  i.loss_scale = s.scale;
  i.skipped_total = s.skipped_total;
  i.skipped_in_a_row = s.skipped_in_a_row;
  i.scale_rule = s.rule;
  for (const auto& [param, slot, t] : state_tensors()) {
    out.trainer.emplace_back("optim/" + param + "/" + slot, t);
  }
  // What evaluation and `kiln export` see where it differs from the training weights.
  for (auto& [name, t] : updates_.eval_weights()) {
    out.trainer.emplace_back(std::string(kEvalPrefix) + name, std::move(t));
  }
  const MasterWeights& stepped = updates_.stepped();
  if (stepped.enabled()) {
    for (size_t k = 0; k < stepped.flat().size(); ++k) {
      out.trainer.emplace_back("master/" + stepped.flat_names()[k], stepped.flat()[k]);
    }
  }
}

void OptimizerSide::restore(const io::CheckpointData& data, c10::Device device) {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> saved(data.trainer.begin(), data.trainer.end());
  const MasterWeights& stepped = updates_.stepped();
  if (stepped.enabled()) {
    for (size_t k = 0; k < stepped.flat().size(); ++k) {
      const auto it = saved.find("master/" + stepped.flat_names()[k]);
      if (it == saved.end()) {
        throw io::CheckpointError("checkpoint has no master weights for '" +
                                  stepped.flat_names()[k] + "'");
      }
      stepped.flat()[k].copy_(it->second);
    }
  }
  // Checkpoints hold state contiguous; it goes back in its parameter's layout, as a step
  // creates it (host_api state_tensor), so channels_last runs keep the fused optimizer kernels.
  std::map<std::string, at::Tensor> params;
  std::map<std::string, size_t> stepped_by;  // parameter -> its optimizer
  for (const ParamGroup& g : groups_) {
    for (size_t i = 0; i < g.params.size(); ++i) {
      params.emplace(g.names[i], g.params[i]);
      stepped_by.emplace(g.names[i], g.optimizer);
    }
  }
  for (const auto& o : optimizers_) {
    o->state().clear();
    if (o->inner() != nullptr) o->inner()->state().clear();
  }
  for (const auto& [key, t] : saved) {
    if (key.rfind("optim/", 0) != 0) continue;
    const size_t slash = key.rfind('/');
    const std::string name = key.substr(6, slash - 6);
    at::Tensor value = t.to(device);
    const auto p = params.find(name);
    if (p != params.end() && p->second.sizes() == value.sizes() &&
        p->second.is_non_overlapping_and_dense()) {
      value = at::empty_like(p->second, value.options()).copy_(value);
    }
    const auto by = stepped_by.find(name);
    plugin::OptimizerAdapter* owner = optimizers_[by == stepped_by.end() ? 0 : by->second].get();
    std::string slot = key.substr(slash + 1);
    if (slot.rfind(kInnerPrefix, 0) == 0 && owner->inner() != nullptr) {
      owner = owner->inner();
      slot = slot.substr(std::string(kInnerPrefix).size());
    }
    owner->state()[name][slot] = value;
  }
  lr_.set_counted(data.info.lr_counted);
  lr_policy_.restore_state(data.info.lr_state);
  scaler_.restore(LossScaler::State{data.info.loss_scale, data.info.skipped_total,
                                    data.info.skipped_in_a_row, data.info.scale_rule});
}

std::vector<std::tuple<std::string, std::string, at::Tensor>> OptimizerSide::state_tensors() const {
  std::vector<std::tuple<std::string, std::string, at::Tensor>> out;
  for (const auto& o : optimizers_) {
    const plugin::OptimizerAdapter& optimizer = *o;
    for (const auto& [param, states] : optimizer.state()) {
      for (const auto& [slot, t] : states) out.emplace_back(param, slot, t);
    }
    if (optimizer.inner() == nullptr) continue;
    for (const auto& [param, states] : optimizer.inner()->state()) {
      for (const auto& [slot, t] : states) out.emplace_back(param, kInnerPrefix + slot, t);
    }
  }
  return out;
}

}  // namespace kiln::engine
