#include "engine/lr_driver.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kiln::engine {

Warmup parse_warmup(const std::string& name) {
  if (name == "none") return Warmup::kNone;
  if (name == "constant") return Warmup::kConstant;
  if (name == "linear") return Warmup::kLinear;
  if (name == "torch_linear") return Warmup::kTorchLinear;
  throw std::invalid_argument("unknown warmup '" + name + "'");
}

const char* warmup_name(Warmup w) {
  switch (w) {
    case Warmup::kConstant:
      return "constant";
    case Warmup::kLinear:
      return "linear";
    case Warmup::kTorchLinear:
      return "torch_linear";
    default:
      return "none";
  }
}

int64_t steps_per_epoch(int64_t batches, int64_t accumulation) {
  return (batches + accumulation - 1) / accumulation;
}

ScheduleFrame schedule_frame(const config::Pipeline& p, int64_t batches_per_epoch) {
  const config::LrPolicySettings& lr = p.settings.lr_policy;
  ScheduleFrame f;
  f.unscaled_lr = p.settings.optimizer.lr;
  // data.batch_size is the global batch (a distributed run splits it over the ranks), so the
  // world size does not multiply it again.
  f.micro_batch = p.settings.data.batch_size;
  f.accumulation = p.settings.run.accumulation_steps;
  f.effective_batch = f.micro_batch * f.accumulation;
  const int64_t base_batch = p.settings.lr_scaling.base_batch;
  // Goyal et al.'s linear rule, on the batch one optimizer step really sees.
  f.base_lr = base_batch > 0 ? f.unscaled_lr * static_cast<double>(f.effective_batch) /
                                   static_cast<double>(base_batch)
                             : f.unscaled_lr;
  f.batches_per_epoch = batches_per_epoch;
  f.iters_per_epoch = steps_per_epoch(batches_per_epoch, f.accumulation);
  f.max_iters = p.settings.run.epochs * f.iters_per_epoch;
  if (p.settings.run.max_steps > 0) f.max_iters = std::min(f.max_iters, p.settings.run.max_steps);
  f.warmup = parse_warmup(lr.warmup);
  const int64_t iters = lr.warmup_iters;
  const double epochs = lr.warmup_epochs;
  if (iters > 0 && epochs > 0) {
    throw std::invalid_argument(
        "lr_policy.warmup_iters and lr_policy.warmup_epochs are both set; give one of them");
  }
  f.warmup_iters =
      epochs > 0 ? static_cast<int64_t>(std::llround(epochs * f.iters_per_epoch)) : iters;
  if (f.warmup == Warmup::kNone) f.warmup_iters = 0;
  if (f.warmup != Warmup::kNone && f.warmup_iters == 0) f.warmup = Warmup::kNone;
  f.warmup_factor = lr.warmup_factor;
  f.count_applied = !lr.count_attempted;
  f.log_change_ratio = lr.log_change_ratio;
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

std::vector<std::pair<std::string, double>> observed_metrics(double loss, double top1, double top5,
                                                             bool multi_label, double map) {
  if (multi_label) return {{"loss", loss}, {"map", map}};
  return {{"loss", loss}, {"top1", top1}, {"top5", top5}};
}

double lr_at(const ScheduleFrame& f, const plugin::LrPolicyAdapter& policy, int64_t iter) {
  if (iter <= f.warmup_iters) {
    // Pet's CONSTANT: lr·F (ConstantLR too). Pet's LINEAR: α = it/W, lr·(F·(1−α)+α), the base
    // rate at it = W. LinearLR(start_factor = F, total_iters = W) is one iteration behind:
    // α = (it − 1)/W, the base rate at it = W + 1, the policy's first iteration.
    if (f.warmup == Warmup::kConstant) return f.base_lr * f.warmup_factor;
    const int64_t done = f.warmup == Warmup::kTorchLinear ? iter - 1 : iter;
    const double alpha = static_cast<double>(done) / static_cast<double>(f.warmup_iters);
    return f.base_lr * (f.warmup_factor * (1.0 - alpha) + alpha);
  }
  return policy.lr_at(iter);
}

std::string LrChangeLog::note(int64_t iter, double lr) {
  if (frame_.log_change_ratio <= 0.0) return "";
  const bool warming = iter <= frame_.warmup_iters;
  std::string out;
  if (!seen_any_) {
    out = fmt::format("lr {:.6g}", lr);
    if (warming) {
      out += fmt::format(" ({} warm-up to {:.6g} over {} steps)", warmup_name(frame_.warmup),
                         frame_.base_lr, frame_.warmup_iters);
    }
  } else if (iter == last_iter_) {
    return "";  // a skipped step that the schedule does not count: the same iteration again
  } else if (!warming && last_iter_ <= frame_.warmup_iters) {
    out = fmt::format("lr {:.6g}: warm-up done", lr);
    last_was_jump_ = false;
  } else if (!warming) {
    // Compared in the direction of the change, so that a drop to 0 is a large change.
    const double hi = std::max(lr, last_lr_), lo = std::min(lr, last_lr_);
    const bool jump = hi > lo * frame_.log_change_ratio;
    if (jump && !last_was_jump_) out = fmt::format("lr {:.6g} -> {:.6g}", last_lr_, lr);
    last_was_jump_ = jump;
  }
  seen_any_ = true;
  last_iter_ = iter;
  last_lr_ = lr;
  return out;
}

}  // namespace kiln::engine
