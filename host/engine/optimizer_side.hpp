// What a run holds of the optimizer side, owned together: the parameter groups, the optimizer
// plugin and its state, the LR policy and the schedule that drives it, the loss scaler and the
// fp32 master weights. A step's update goes through one entry (step), and a checkpoint saves
// and restores all of it through state()/restore().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "config/pipeline.hpp"
#include "engine/loss_scaler.hpp"
#include "engine/lr_driver.hpp"
#include "engine/optimizer_step.hpp"
#include "engine/param_groups.hpp"
#include "engine/window_pass.hpp"
#include "io/checkpoint.hpp"
#include "io/metrics.hpp"
#include "plugin/adapters.hpp"

namespace kiln::engine {

// A checkpoint's trainer part keeps the evaluation weights an optimizer gives (Schedule-Free's
// x) as "<kEvalPrefix><name>"; `kiln export` writes them.
inline constexpr const char* kEvalPrefix = "eval/";

// The evaluation weights `data` holds, under the model's names; empty when it holds none.
std::vector<std::pair<std::string, at::Tensor>> saved_eval_weights(const io::CheckpointData& data);

// [optimizer] (with its [optimizer.inner]), then each [[optimizer.partition]]'s optimizer, as
// a run creates them; `group` (null: one process) carries their collectives.
std::vector<std::unique_ptr<plugin::OptimizerAdapter>> make_optimizers(const config::Pipeline& p,
                                                                       dist::ProcessGroup* group);

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

  // Optimizer state, master weights, the schedule's count and state and the loss scale, into a
  // checkpoint's trainer part, and the evaluation weights when an optimizer gives them
  // ("eval/<name>"); restore() puts them back (optimizer state onto `device`).
  void state(io::CheckpointData& out) const;
  void restore(const io::CheckpointData& data, c10::Device device);
  // Every optimizer state tensor as (parameter, slot, tensor); a wrapper's inner optimizer's
  // slots are "inner.<slot>".
  std::vector<std::tuple<std::string, std::string, at::Tensor>> state_tensors() const;

  // Runs `f` with the evaluation weights in the model, where an optimizer gives them
  // (Schedule-Free's x), and the training weights back after, also when `f` throws.
  template <typename F>
  auto with_eval_weights(F&& f) -> decltype(f()) {
    if (!updates_.has_eval_weights()) return f();
    updates_.swap_in_eval_weights();
    try {
      auto result = f();
      updates_.swap_out_eval_weights();
      return result;
    } catch (...) {
      updates_.swap_out_eval_weights();
      throw;
    }
  }

  // An evaluation's results, for an LR policy that reacts to them (ABI 1.15: ReduceLROnPlateau
  // and the like): "loss", and "top1" and "top5" or, for multi-label data, "map".
  void observe(const io::EvalRecord& record);

  const std::vector<ParamGroup>& groups() const { return groups_; }
  std::vector<std::string> group_names() const;
  const ClipSettings& clip() const { return clip_; }
  const LossScaler& scaler() const { return scaler_; }
  LrDriver& lr() { return lr_; }
  OptimizerStep& updates() { return updates_; }
  // [optimizer]'s; optimizers() also those of [[optimizer.partition]], in order.
  const plugin::OptimizerAdapter& optimizer() const { return *optimizers_.front(); }
  const std::vector<std::unique_ptr<plugin::OptimizerAdapter>>& optimizers() const {
    return optimizers_;
  }

 private:
  std::vector<ParamGroup> groups_;
  std::vector<std::unique_ptr<plugin::OptimizerAdapter>> optimizers_;
  plugin::LrPolicyAdapter lr_policy_;
  LrDriver lr_;
  LossScaler scaler_;
  ClipSettings clip_;
  OptimizerStep updates_;  // holds references to the members above
};

}  // namespace kiln::engine
