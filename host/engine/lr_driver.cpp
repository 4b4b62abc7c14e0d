#include "engine/lr_driver.hpp"

#include <stdexcept>

namespace kiln::engine {

Warmup parse_warmup(const std::string& name) {
  if (name == "none") return Warmup::kNone;
  if (name == "constant") return Warmup::kConstant;
  if (name == "linear") return Warmup::kLinear;
  throw std::invalid_argument("unknown warmup '" + name + "'");
}

LrDriver::LrDriver(const plugin::LrPolicyAdapter& policy, double base_lr, Warmup warmup,
                   int64_t warmup_iters, double warmup_factor)
    : policy_(policy),
      base_lr_(base_lr),
      warmup_(warmup),
      warmup_iters_(warmup == Warmup::kNone ? 0 : warmup_iters),
      warmup_factor_(warmup_factor) {}

double LrDriver::lr_at(int64_t iter) const {
  // Pet: warm up while it <= warm_up_iters; CONSTANT: lr·F; LINEAR: α = it/W, lr·(F·(1−α)+α).
  if (iter <= warmup_iters_) {
    if (warmup_ == Warmup::kConstant) return base_lr_ * warmup_factor_;
    double alpha = static_cast<double>(iter) / static_cast<double>(warmup_iters_);
    return base_lr_ * (warmup_factor_ * (1.0 - alpha) + alpha);
  }
  return policy_.lr_at(iter);
}

}  // namespace kiln::engine
