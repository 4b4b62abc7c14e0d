// The learning rate at each step: the host's warm-up (Pet's formula) for iterations
// 1..warmup_iters, then the LR policy plugin; base lr linearly scaled by the effective batch;
// the iteration counting attempted or applied steps.
#pragma once

#include <cstdint>
#include <string>

#include "config/pipeline.hpp"
#include "plugin/adapters.hpp"

namespace kiln::engine {

enum class Warmup { kNone, kConstant, kLinear };
Warmup parse_warmup(const std::string& name);  // "none", "constant", "linear"

// The schedule's frame in iterations, from the pipeline and the loader's length.
struct ScheduleFrame {
  double base_lr = 0.0;         // after linear batch scaling
  double unscaled_lr = 0.0;     // optimizer.lr as configured
  int64_t effective_batch = 0;  // world size × micro-batch × accumulation steps
  int64_t iters_per_epoch = 0;  // optimizer steps per epoch
  int64_t max_iters = 0;        // optimizer steps of the run
  Warmup warmup = Warmup::kNone;
  int64_t warmup_iters = 0;  // 0 when there is no warm-up
  double warmup_factor = 0.0;
  bool count_applied = true;      // the schedule advances on applied (not skipped) steps only
  double log_change_ratio = 0.0;  // log when lr changes by more than this ratio; 0 = never
};

// Throws std::invalid_argument naming the keys when warmup_iters and warmup_epochs are both set.
ScheduleFrame schedule_frame(const config::Pipeline& pipeline, int64_t iters_per_epoch,
                             int64_t world_size = 1, int64_t accumulation = 1);

// The kiln_lr_schedule a policy plugin is created with.
kiln_lr_schedule to_policy_schedule(const ScheduleFrame& frame);

// Pure: the learning rate of 1-based iteration `iter`.
double lr_at(const ScheduleFrame& frame, const plugin::LrPolicyAdapter& policy, int64_t iter);

// Follows the run: the lr for the step about to run, advanced after each step.
class LrDriver {
 public:
  LrDriver(const ScheduleFrame& frame, const plugin::LrPolicyAdapter& policy)
      : frame_(frame), policy_(policy) {}
  // Learning rate for the next step (iteration = counted steps + 1).
  double current() const { return lr_at(frame_, policy_, counted_ + 1); }
  // After a step: counts it unless it was skipped and the schedule counts applied steps.
  void advance(bool applied) {
    if (applied || !frame_.count_applied) ++counted_;
  }
  int64_t counted() const { return counted_; }
  void set_counted(int64_t counted) { counted_ = counted; }  // resume
  // True (and remembers `lr`) when `lr` differs from the last reported lr by more than the
  // change ratio; the first call always reports.
  bool changed_notably(double lr);

 private:
  ScheduleFrame frame_;
  const plugin::LrPolicyAdapter& policy_;
  int64_t counted_ = 0;
  bool reported_any_ = false;
  double reported_ = 0.0;
};

}  // namespace kiln::engine
