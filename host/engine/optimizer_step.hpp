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
  // check.loss.
  StepOutcome run(int64_t step, const at::Tensor& loss = {});
  // The same after a check already read (a step whose backward and check ran as a CUDA graph):
  // clipping, the loss-scale update and the optimizer. Not for master weights.
  StepOutcome run_after_check(int64_t step, const GradCheck& read);
  const MasterWeights& stepped() const { return stepped_; }

 private:
  // The loss-scale update and the optimizer (or a skip) after the check.
  StepOutcome apply(int64_t step, GradCheck check);

  const std::vector<ParamGroup>& groups_;
  MasterWeights stepped_;
  plugin::OptimizerAdapter& optimizer_;
  LossScaler& scaler_;
  LrDriver& lr_;
  ClipSettings clip_;
  std::vector<at::Tensor> model_params_;
};

}  // namespace kiln::engine
