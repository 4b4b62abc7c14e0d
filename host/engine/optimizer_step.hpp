// Everything between backward and the next forward for one optimizer step: gradients into the
// stepped tensors (fp32 masters under O2), unscaled once and checked in one fused pass, clipped,
// the loss scale updated by the precision plugin's rule, then either the optimizer runs on every
// group (and masters are cast down into the model) or — non-finite gradients — nothing is
// touched: no weight, no optimizer state and, unless the schedule counts attempted steps, not the
// LR schedule.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/gradients.hpp"
#include "engine/loss_scaler.hpp"
#include "engine/lr_driver.hpp"
#include "engine/master_weights.hpp"
#include "engine/param_groups.hpp"
#include "plugin/adapters.hpp"

namespace kiln::engine {

struct StepOutcome {
  StepVerdict verdict = StepVerdict::kApply;
  GradCheck check;
  double scale = 1.0;             // the loss scale the step's gradients carried
  double lr = 0.0;                // the schedule's lr at this step (before group scales)
  std::vector<double> group_lrs;  // lr of each group at this step
};

class OptimizerStep {
 public:
  // All references must outlive this object.
  OptimizerStep(const std::vector<ParamGroup>& groups, const PrecisionPlan& plan,
                plugin::OptimizerAdapter& optimizer, LossScaler& scaler, LrDriver& lr,
                const ClipSettings& clip);

  // Drops the model's gradients (set_to_none) before a new accumulation window.
  void zero_grad();
  // Runs optimizer step number `step` (1-based, attempted steps) on the gradients backward left.
  // `loss` (optional, one element on the device) is read back with the gradient check, into
  // check.loss. Without `check_gradients` (and with a loss) only the loss guards the step
  // (check_loss_only): for a step that neither unscales nor clips.
  StepOutcome run(int64_t step, const at::Tensor& loss = {}, bool check_gradients = true);
  // The same after a check already read (a step whose backward and check ran as a CUDA graph):
  // clipping, the loss-scale update and the optimizer. Not for master weights.
  StepOutcome run_after_check(int64_t step, const GradCheck& read);
  const MasterWeights& stepped() const { return stepped_; }

  // ---- the update inside a CUDA graph (run.cuda_graph) ----
  // Whether clipping and the optimizer can be enqueued without a host read: a capturable
  // optimizer plugin and no master weights.
  bool capturable() const;
  // Writes each group's lr for the coming step into its device tensor, on the current stream;
  // before every replay.
  void set_device_lrs();
  // Enqueues clipping by the norm in `readout` (launch_gradient_check's [found_inf, norm, ...])
  // and every group's optimizer step (number `step`), which the device skips when the check
  // failed. Reads nothing back, so a graph can capture it.
  void enqueue_update(int64_t step, const at::Tensor& readout);
  // The host's half of a step whose update ran on the device: the scale rule, the verdict, the
  // schedule, and the names of non-finite gradients.
  StepOutcome after_device_update(int64_t step, const GradCheck& read);

 private:
  // The loss-scale update and the optimizer (or a skip) after the check; the optimizer is not
  // called again when `update_ran` (the device ran it, gated on the check).
  StepOutcome apply(int64_t step, GradCheck check, bool update_ran = false);

  const std::vector<ParamGroup>& groups_;
  MasterWeights stepped_;
  plugin::OptimizerAdapter& optimizer_;
  LossScaler& scaler_;
  LrDriver& lr_;
  ClipSettings clip_;
  std::vector<at::Tensor> model_params_;
  std::vector<at::Tensor> device_lrs_;  // per group, 0-dim float32 (set_device_lrs)
  at::Tensor found_inf_;                // 0-dim float32: the check failed (enqueue_update)
};

}  // namespace kiln::engine
