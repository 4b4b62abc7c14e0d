// The learning rate at each step: the host's warm-up for iterations 1..warmup_iters, then the LR
// policy plugin; base lr linearly scaled by the effective batch; the iteration counting
// attempted or applied steps.
//
// Iterations are 1-based and name the optimizer step about to run: the first step trains at
// lr_at(1). A step that the schedule does not count (a skipped step under count = "applied")
// leaves the next step at the same iteration. Warm-up replaces the policy's rate for iterations
// 1..warmup_iters (Pet's get_lr); from warmup_iters + 1 on, the plugin's lr_at(iter) is the
// rate, with the same iteration number (docs/abi.md).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/pipeline.hpp"
#include "plugin/adapters.hpp"

namespace kiln::engine {

// kLinear is Pet's LINEAR (base lr at iteration warmup_iters); kTorchLinear is PyTorch's
// LinearLR (base lr at warmup_iters + 1); kConstant is Pet's CONSTANT and ConstantLR alike.
enum class Warmup { kNone, kConstant, kLinear, kTorchLinear };
Warmup parse_warmup(const std::string& name);  // "none", "constant", "linear", "torch_linear"
const char* warmup_name(Warmup warmup);        // the name parse_warmup takes

// The schedule's frame in iterations (optimizer steps).
struct ScheduleFrame {
  double base_lr = 0.0;           // after linear batch scaling
  double unscaled_lr = 0.0;       // optimizer.lr as configured
  int64_t micro_batch = 0;        // data.batch_size: the global batch of one forward pass
  int64_t accumulation = 1;       // run.accumulation_steps
  int64_t effective_batch = 0;    // samples per optimizer step: micro_batch × accumulation
  int64_t batches_per_epoch = 0;  // micro-batches per epoch (the loader's)
  int64_t iters_per_epoch = 0;    // optimizer steps per epoch
  int64_t max_iters = 0;          // optimizer steps of the run
  Warmup warmup = Warmup::kNone;
  int64_t warmup_iters = 0;  // 0 when there is no warm-up
  double warmup_factor = 0.0;
  bool count_applied = true;      // the schedule advances on applied (not skipped) steps only
  double log_change_ratio = 0.0;  // see LrChangeLog; 0 = never
};

// Optimizer steps in an epoch of `batches` micro-batches: the last window of an epoch may be
// shorter than `accumulation` and is a step of its own.
int64_t steps_per_epoch(int64_t batches, int64_t accumulation);

// The one computation of the frame, shared by the run, `kiln plan` and `kiln lr-schedule`:
// from the pipeline (optimizer.lr, data.batch_size, run.accumulation_steps, run.epochs,
// run.max_steps, [lr_policy], [lr_scaling]) and the training loader's micro-batches per epoch.
// Throws std::invalid_argument naming the keys when warmup_iters and warmup_epochs are both set.
ScheduleFrame schedule_frame(const config::Pipeline& pipeline, int64_t batches_per_epoch);

// The kiln_lr_schedule a policy plugin is created with.
kiln_lr_schedule to_policy_schedule(const ScheduleFrame& frame);

// What a policy that reacts to evaluations observes of one (kiln_lr_observation's metrics):
// "loss", and "top1" and "top5", or for multi-label data "map".
std::vector<std::pair<std::string, double>> observed_metrics(double loss, double top1, double top5,
                                                             bool multi_label, double map);

// Pure: the learning rate of 1-based iteration `iter`.
double lr_at(const ScheduleFrame& frame, const plugin::LrPolicyAdapter& policy, int64_t iter);

// Which lr changes a run logs, so that the console keeps to what a person wants to see (the
// progress lines show the lr anyway): the first step's lr, with the warm-up it starts; the end
// of warm-up; and a step that changes the lr by more than log_change_ratio (a milestone's decay)
// after one that did not. A run of such steps (a fast exponential decay, the tail of a cosine
// towards 0) logs its first step only. Skipped steps repeat an iteration and change nothing.
class LrChangeLog {
 public:
  explicit LrChangeLog(const ScheduleFrame& frame) : frame_(frame) {}
  // The step at iteration `iter` ran at `lr`: what to log about it, or "" for nothing.
  std::string note(int64_t iter, double lr);

 private:
  ScheduleFrame frame_;
  bool seen_any_ = false;
  int64_t last_iter_ = 0;
  double last_lr_ = 0.0;
  bool last_was_jump_ = false;  // the previous step changed the lr by more than the ratio
};

// Follows the run: the lr for the step about to run, advanced after each step.
class LrDriver {
 public:
  LrDriver(const ScheduleFrame& frame, const plugin::LrPolicyAdapter& policy)
      : frame_(frame), policy_(policy), log_(frame) {}
  // Learning rate for the next step (iteration = counted steps + 1).
  double current() const { return lr_at(frame_, policy_, counted_ + 1); }
  // After a step: counts it unless it was skipped and the schedule counts applied steps.
  void advance(bool applied) {
    last_iter_ = counted_ + 1;
    if (applied || !frame_.count_applied) ++counted_;
  }
  int64_t counted() const { return counted_; }
  void set_counted(int64_t counted) { counted_ = counted; }  // resume
  // After advance(): what to log about the step just taken at `lr` (LrChangeLog), or "".
  std::string change_note(double lr) { return log_.note(last_iter_, lr); }

 private:
  ScheduleFrame frame_;
  const plugin::LrPolicyAdapter& policy_;
  LrChangeLog log_;
  int64_t counted_ = 0;
  int64_t last_iter_ = 0;  // the iteration of the step advance() last saw
};

}  // namespace kiln::engine
