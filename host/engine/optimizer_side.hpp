// What a run holds of the optimizer side, owned together: the parameter groups, the optimizer
// plugin and its state, the LR policy and the schedule that drives it, the loss scaler and the
// fp32 master weights. A step's update goes through one entry (step), and a checkpoint saves
// and restores all of it through state()/restore().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/pipeline.hpp"
#include "engine/loss_scaler.hpp"
#include "engine/lr_driver.hpp"
#include "engine/optimizer_step.hpp"
#include "engine/param_groups.hpp"
#include "engine/window_pass.hpp"
#include "io/checkpoint.hpp"
#include "plugin/adapters.hpp"

namespace kiln::engine {

class OptimizerSide {
 public:
  // Groups the model's trainable parameters by the pipeline's rules and creates the optimizer,
  // the LR policy over `frame` and the loss scaler. The optimizer's collectives run on `group`
  // (null: one process). `precision` and `group` must outlive this object.
  OptimizerSide(const config::Pipeline& pipeline, torch::nn::Module& model,
                const PrecisionPlan& plan, plugin::PrecisionAdapter& precision,
                const ScheduleFrame& frame, dist::ProcessGroup* group);
  OptimizerSide(const OptimizerSide&) = delete;
  OptimizerSide& operator=(const OptimizerSide&) = delete;

  // Unscale, check, clip, the loss-scale update; then the optimizer, or a skip that touches
  // nothing. `w` says what the window already did: an eager window leaves its loss, a graphed
  // one the check it read back and whether its replay ran the update on the device.
  StepOutcome step(int64_t step, const WindowResult& w, bool check_gradients);

  // Optimizer state, master weights, the schedule's count and the loss scale, into a
  // checkpoint's trainer part; restore() puts them back (optimizer state onto `device`).
  void state(io::CheckpointData& out) const;
  void restore(const io::CheckpointData& data, c10::Device device);

  const std::vector<ParamGroup>& groups() const { return groups_; }
  std::vector<std::string> group_names() const;
  const ClipSettings& clip() const { return clip_; }
  const LossScaler& scaler() const { return scaler_; }
  LrDriver& lr() { return lr_; }
  OptimizerStep& updates() { return updates_; }
  const plugin::OptimizerAdapter& optimizer() const { return optimizer_; }

 private:
  std::vector<ParamGroup> groups_;
  plugin::OptimizerAdapter optimizer_;
  plugin::LrPolicyAdapter lr_policy_;
  LrDriver lr_;
  LossScaler scaler_;
  ClipSettings clip_;
  OptimizerStep updates_;  // holds references to the members above
};

}  // namespace kiln::engine
