// The learning rate at each iteration: the host's warm-up (Pet's formula) for iterations
// 1..warmup_iters, then the LR policy plugin.
#pragma once

#include <cstdint>
#include <string>

#include "plugin/adapters.hpp"

namespace kiln::engine {

enum class Warmup { kNone, kConstant, kLinear };
Warmup parse_warmup(const std::string& name);  // "none", "constant", "linear"

class LrDriver {
 public:
  LrDriver(const plugin::LrPolicyAdapter& policy, double base_lr, Warmup warmup,
           int64_t warmup_iters, double warmup_factor);
  // Learning rate for 1-based iteration `iter`.
  double lr_at(int64_t iter) const;

 private:
  const plugin::LrPolicyAdapter& policy_;
  double base_lr_;
  Warmup warmup_;
  int64_t warmup_iters_;
  double warmup_factor_;
};

}  // namespace kiln::engine
