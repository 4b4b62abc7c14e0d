// The loss scale over a run: the value the loss is multiplied by, updated once per optimizer
// step by the precision plugin's rule, and the host's guards around it — an overflow at the
// minimum scale (skip or stop, as the policy says) and, when the scale cannot move (no or static
// scaling), a limit on consecutive non-finite steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/precision.hpp"
#include "plugin/adapters.hpp"

namespace kiln::engine {

// What the trainer does after a step's gradient check.
enum class StepVerdict {
  kApply,  // gradients finite: run the optimizer
  kSkip,   // non-finite: leave weights, optimizer state and (by default) the schedule alone
  kStop,   // non-finite, and a guard says the run cannot go on; `stop_reason` says why
};

class LossScaler {
 public:
  // `max_nonfinite_steps`: consecutive skipped steps tolerated when the scale cannot move.
  LossScaler(const PrecisionPlan& plan, plugin::PrecisionAdapter& precision,
             int64_t max_nonfinite_steps);

  double scale() const { return scale_; }
  bool scaling() const { return plan_.loss_scaling != KILN_SCALE_NONE; }

  // Records a step's outcome, updates the scale through the plugin's rule (exactly once per
  // optimizer step) and says what to do with the step.
  StepVerdict after_check(bool grads_finite);

  int64_t skipped_total() const { return skipped_total_; }
  int64_t skipped_in_a_row() const { return skipped_in_a_row_; }
  const std::string& stop_reason() const { return stop_reason_; }
  // Set by after_check: the scale before the last update (the one the step was scaled by).
  double last_step_scale() const { return last_step_scale_; }

  // Everything a checkpoint needs to continue exactly: scale, counters, the rule's own state.
  struct State {
    double scale = 1.0;
    int64_t skipped_total = 0, skipped_in_a_row = 0;
    std::vector<double> rule;  // the plugin's counters
  };
  State state() const;
  void restore(const State& state);

 private:
  PrecisionPlan plan_;
  plugin::PrecisionAdapter& precision_;
  int64_t max_nonfinite_steps_;
  double scale_;
  double last_step_scale_;
  int64_t skipped_total_ = 0;
  int64_t skipped_in_a_row_ = 0;
  bool warned_at_min_ = false;
  std::string stop_reason_;
};

}  // namespace kiln::engine
