// Everything between backward and the next forward for one optimizer step: gradients into the
// stepped tensors (fp32 masters under O2), unscaled once and checked in one fused pass, clipped,
// the loss scale updated by the precision plugin's rule, then either the optimizer runs on every
// group (and masters are cast down into the model) or — non-finite gradients — nothing is
// touched: no weight, no optimizer state and, unless the schedule counts attempted steps, not the
// LR schedule.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/gradients.hpp"
#include "engine/loss_scaler.hpp"
#include "engine/lr_driver.hpp"
#include "engine/master_weights.hpp"
#include "engine/param_groups.hpp"
#include "engine/window_pass.hpp"
#include "plugin/adapters.hpp"

namespace kiln::engine {

struct StepOutcome {
  StepVerdict verdict = StepVerdict::kApply;
  GradCheck check;
  double scale = 1.0;             // the loss scale the step's gradients carried
  double lr = 0.0;                // the schedule's lr at this step (before group scales)
  std::vector<double> group_lrs;  // lr of each group at this step
  int64_t reevaluations = 0;      // extra forward and backward passes the optimizer asked for
};

// Runs the step's window of micro-batches forward and backward again (the same batches), the
// loss multiplied by `scale` / window, gradients accumulated into the model's; the model's
// buffers as they were before. Set by the trainer for optimizers that re-evaluate.
using WindowRerun = std::function<WindowResult(double scale)>;

class OptimizerStep {
 public:
  // All references must outlive this object.
  // `optimizers[k]` steps the groups whose ParamGroup::optimizer is k. `process_group` (null: one
  // process) averages a re-evaluation's loss over the ranks.
  OptimizerStep(const std::vector<ParamGroup>& groups, const PrecisionPlan& plan,
                std::vector<plugin::OptimizerAdapter*> optimizers, LossScaler& scaler, LrDriver& lr,
                const ClipSettings& clip, dist::ProcessGroup* process_group);

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

  // ---- re-evaluation (an optimizer's step_all, ABI 1.14) ----
  // The window the next run() steps on: how many micro-batches and samples (its loss is a mean
  // for one micro-batch, else a sum over samples), and how to run it again.
  void set_window(int64_t micro_batches, int64_t samples) {
    window_micro_batches_ = micro_batches;
    window_samples_ = samples;
  }
  void set_rerun(WindowRerun rerun) { rerun_ = std::move(rerun); }
  // Whether an optimizer takes the whole step (and may re-evaluate).
  bool reevaluates() const;

  // ---- evaluation weights (an optimizer's eval_weights, ABI 1.14) ----
  // Whether an optimizer gives evaluation weights.
  bool has_eval_weights() const;
  // The evaluation weights of every parameter the optimizers give them for, under the model's
  // names, as new tensors of the stepped dtype.
  std::vector<std::pair<std::string, at::Tensor>> eval_weights() const;
  // Puts the evaluation weights in the model, and the training weights back.
  void swap_in_eval_weights();
  void swap_out_eval_weights();

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
  // Every optimizer on its groups; returns the re-evaluations they asked for.
  int64_t step_optimizers(int64_t step, const std::vector<double>& group_lrs, double loss);
  // The view of group `g` at step `step`.
  plugin::GroupStep group_step(size_t g, int64_t step, double lr) const;
  // One re-evaluation: the loss and gradients at the weights the optimizer wrote.
  kiln_reevaluation reevaluate();
  // Group `g`'s evaluation weights, one new tensor per stepped parameter (empty when its
  // optimizer gives none).
  std::vector<at::Tensor> group_eval_weights(size_t g) const;
  // The window's mean loss from a check's read (a mean, or a sum over samples), over the ranks.
  double mean_loss(double read, int64_t micro_batches, int64_t samples) const;

  const std::vector<ParamGroup>& groups_;
  MasterWeights stepped_;
  std::vector<plugin::OptimizerAdapter*> optimizers_;
  dist::ProcessGroup* process_group_;
  WindowRerun rerun_;
  int64_t window_micro_batches_ = 1;
  int64_t window_samples_ = 1;
  int64_t reevaluations_ = 0;           // in the step being applied
  int64_t last_step_ = 0;               // the last applied step's number, for eval_weights
  std::vector<double> last_group_lrs_;  // and its lrs
  std::vector<at::Tensor> trained_;     // the model's weights while evaluation weights are in
  std::vector<at::Tensor> swapped_;     // the model's tensors those belong to
  LossScaler& scaler_;
  LrDriver& lr_;
  ClipSettings clip_;
  std::vector<at::Tensor> model_params_;
  std::vector<at::Tensor> device_lrs_;  // per group, 0-dim float32 (set_device_lrs)
  at::Tensor found_inf_;                // 0-dim float32: the check failed (enqueue_update)
};

}  // namespace kiln::engine
