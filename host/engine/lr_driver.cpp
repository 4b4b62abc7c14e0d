#include "engine/lr_driver.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kiln::engine {

Warmup parse_warmup(const std::string& name) {
  if (name == "none") return Warmup::kNone;
  if (name == "constant") return Warmup::kConstant;
  if (name == "linear") return Warmup::kLinear;
  throw std::invalid_argument("unknown warmup '" + name + "'");
}

ScheduleFrame schedule_frame(const config::Pipeline& p, int64_t iters_per_epoch, int64_t world_size,
                             int64_t accumulation) {
  const config::OptionSet& lr = p.lr_policy.core;
  ScheduleFrame f;
  f.unscaled_lr = p.optimizer.core.get_float("lr");
  f.effective_batch = world_size * p.data.get_int("batch_size") * accumulation;
  const int64_t base_batch = p.lr_scaling.get_int("base_batch");
  // Goyal et al.'s linear rule, on the batch one optimizer step really sees.
  f.base_lr = base_batch > 0 ? f.unscaled_lr * static_cast<double>(f.effective_batch) /
                                   static_cast<double>(base_batch)
                             : f.unscaled_lr;
  f.iters_per_epoch = iters_per_epoch;
  f.max_iters = p.run.get_int("epochs") * iters_per_epoch;
  if (p.run.get_int("max_steps") > 0)
    f.max_iters = std::min(f.max_iters, p.run.get_int("max_steps"));
  f.warmup = parse_warmup(lr.get_string("warmup"));
  const int64_t iters = lr.get_int("warmup_iters");
  const double epochs = lr.get_float("warmup_epochs");
  if (iters > 0 && epochs > 0) {
    throw std::invalid_argument(
        "lr_policy.warmup_iters and lr_policy.warmup_epochs are both set; give one of them");
  }
  f.warmup_iters =
      epochs > 0 ? static_cast<int64_t>(std::llround(epochs * iters_per_epoch)) : iters;
  if (f.warmup == Warmup::kNone) f.warmup_iters = 0;
  if (f.warmup != Warmup::kNone && f.warmup_iters == 0) f.warmup = Warmup::kNone;
  f.warmup_factor = lr.get_float("warmup_factor");
  f.count_applied = lr.get_string("count") == "applied";
  f.log_change_ratio = lr.get_float("log_change_ratio");
  return f;
}

kiln_lr_schedule to_policy_schedule(const ScheduleFrame& f) {
  kiln_lr_schedule s{};
  s.struct_size = sizeof(s);
  s.base_lr = f.base_lr;
  s.max_iters = f.max_iters;
  s.warmup_iters = f.warmup_iters;
  s.iters_per_epoch = f.iters_per_epoch;
  return s;
}

double lr_at(const ScheduleFrame& f, const plugin::LrPolicyAdapter& policy, int64_t iter) {
  // Pet: warm up while it <= warm_up_iters; CONSTANT: lr·F; LINEAR: α = it/W, lr·(F·(1−α)+α).
  if (iter <= f.warmup_iters) {
    if (f.warmup == Warmup::kConstant) return f.base_lr * f.warmup_factor;
    const double alpha = static_cast<double>(iter) / static_cast<double>(f.warmup_iters);
    return f.base_lr * (f.warmup_factor * (1.0 - alpha) + alpha);
  }
  return policy.lr_at(iter);
}

bool LrDriver::changed_notably(double lr) {
  if (frame_.log_change_ratio <= 0.0) return false;
  if (reported_any_) {
    // Compare in the direction of the change so a drop to 0 counts as a large change.
    const double hi = std::max(lr, reported_), lo = std::min(lr, reported_);
    if (hi <= lo * frame_.log_change_ratio) return false;
  }
  reported_any_ = true;
  reported_ = lr;
  return true;
}

}  // namespace kiln::engine
