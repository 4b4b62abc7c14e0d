#include "engine/loss_scaler.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace kiln::engine {

LossScaler::LossScaler(const PrecisionPlan& plan, plugin::PrecisionAdapter& precision,
                       int64_t max_nonfinite_steps)
    : plan_(plan),
      precision_(precision),
      max_nonfinite_steps_(max_nonfinite_steps),
      scale_(plan.initial_scale),
      last_step_scale_(plan.initial_scale) {}

StepVerdict LossScaler::after_check(bool grads_finite) {
  last_step_scale_ = scale_;
  if (plan_.loss_scaling == KILN_SCALE_DYNAMIC) {
    scale_ = precision_.update_scale(grads_finite, scale_);
  }
  if (grads_finite) {
    skipped_in_a_row_ = 0;
    return StepVerdict::kApply;
  }
  ++skipped_total_;
  ++skipped_in_a_row_;

  if (plan_.loss_scaling == KILN_SCALE_DYNAMIC) {
    // The rule can lower the scale no further: more of the same would skip forever.
    if (last_step_scale_ <= plan_.min_scale) {
      if (plan_.stop_at_min_scale) {
        stop_reason_ = fmt::format(
            "gradients overflowed at the minimum loss scale {} (precision '{}', at_min_scale = "
            "\"stop\"); the model produces non-finite gradients even unscaled. Lower the lr, "
            "check the data, or use bf16/fp32",
            plan_.min_scale, plan_.name);
        return StepVerdict::kStop;
      }
      if (!warned_at_min_) {
        spdlog::warn(
            "gradients overflow at the minimum loss scale {}; skipping such steps "
            "(at_min_scale = \"skip\")",
            plan_.min_scale);
        warned_at_min_ = true;
      }
    }
    return StepVerdict::kSkip;
  }
  // No scale to lower: repeated non-finite steps mean the run diverged.
  if (skipped_in_a_row_ >= max_nonfinite_steps_) {
    stop_reason_ = fmt::format(
        "{} consecutive steps with non-finite gradients or loss under precision '{}' ({}); the "
        "run diverged. Lower the lr, clip gradients (optimizer.clip_grad_norm), or use a policy "
        "with dynamic loss scaling (amp, o2)",
        skipped_in_a_row_, plan_.name,
        plan_.loss_scaling == KILN_SCALE_STATIC ? fmt::format("static loss scale {}", scale_)
                                                : std::string("no loss scaling"));
    return StepVerdict::kStop;
  }
  return StepVerdict::kSkip;
}

LossScaler::State LossScaler::state() const {
  return State{scale_, skipped_total_, skipped_in_a_row_, precision_.scale_rule_state()};
}

void LossScaler::restore(const State& state) {
  scale_ = last_step_scale_ = state.scale;
  skipped_total_ = state.skipped_total;
  skipped_in_a_row_ = state.skipped_in_a_row;
  precision_.restore_scale_rule_state(state.rule);
}

}  // namespace kiln::engine
