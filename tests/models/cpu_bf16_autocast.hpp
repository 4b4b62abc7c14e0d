// CPU bfloat16 autocast for a scope, for the model tests' oracle checks.
#pragma once

#include <ATen/autocast_mode.h>

namespace kiln_test {

// What CPU bfloat16 autocast does in Python's torch.autocast("cpu", dtype=torch.bfloat16):
// enabled for the scope, restoring the previous state (and clearing the cast cache) after.
class CpuBf16Autocast {
 public:
  CpuBf16Autocast()
      : enabled_(at::autocast::is_autocast_enabled(at::kCPU)),
        dtype_(at::autocast::get_autocast_dtype(at::kCPU)) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~CpuBf16Autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, enabled_);
    at::autocast::set_autocast_dtype(at::kCPU, dtype_);
  }
  CpuBf16Autocast(const CpuBf16Autocast&) = delete;
  CpuBf16Autocast& operator=(const CpuBf16Autocast&) = delete;

 private:
  bool enabled_;
  at::ScalarType dtype_;
};

}  // namespace kiln_test
