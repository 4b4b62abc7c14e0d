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

}  // namespace

OptimizerSide::OptimizerSide(const config::Pipeline& p, torch::nn::Module& model,
                             const PrecisionPlan& plan, plugin::PrecisionAdapter& precision,
                             const ScheduleFrame& frame, dist::ProcessGroup* group)
    : groups_(build_param_groups(model, group_rules(p))),
      optimizer_(*p.optimizer.component, p.optimizer.options, group),
      lr_policy_(*p.lr_policy.component, p.lr_policy.options, to_policy_schedule(frame)),
      lr_(frame, lr_policy_),
      scaler_(plan, precision, p.settings.run.max_nonfinite_steps),
      clip_(clip_settings(p.settings.optimizer)),
      updates_(groups_, plan, optimizer_, scaler_, lr_, clip_) {}

StepOutcome OptimizerSide::step(int64_t step, const WindowResult& w, bool check_gradients) {
  if (w.update_ran) return updates_.after_device_update(step, *w.check);
  if (w.check) return updates_.run_after_check(step, *w.check);
  return updates_.run(step, w.loss, check_gradients);
}

std::vector<std::string> OptimizerSide::group_names() const {
  std::vector<std::string> names;
  for (const ParamGroup& g : groups_) names.push_back(g.name);
  return names;
}

void OptimizerSide::state(io::CheckpointData& out) const {
  io::CheckpointInfo& i = out.info;
  i.lr_counted = lr_.counted();
  const LossScaler::State s = scaler_.state();
  i.loss_scale = s.scale;
  i.skipped_total = s.skipped_total;
  i.skipped_in_a_row = s.skipped_in_a_row;
  i.scale_rule = s.rule;
  for (const auto& [param, states] : optimizer_.state()) {
    for (const auto& [name, t] : states) out.trainer.emplace_back("optim/" + param + "/" + name, t);
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
  for (const ParamGroup& g : groups_) {
    for (size_t i = 0; i < g.params.size(); ++i) params.emplace(g.names[i], g.params[i]);
  }
  optimizer_.state().clear();
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
    optimizer_.state()[name][key.substr(slash + 1)] = value;
  }
  lr_.set_counted(data.info.lr_counted);
  scaler_.restore(LossScaler::State{data.info.loss_scale, data.info.skipped_total,
                                    data.info.skipped_in_a_row, data.info.scale_rule});
}

}  // namespace kiln::engine
