// Progress lines with throughput and ETA, printed at an interval of steps.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::io {

// "1:02:03" / "2:03" style duration.
std::string format_duration(double seconds);

struct ProgressState {
  int64_t epoch = 0, epochs = 0;      // 1-based epoch and total
  int64_t step = 0, total_steps = 0;  // 1-based global step and total
  double loss = 0.0;                  // mean loss since the last line
  double lr = 0.0;                    // first group's lr
  double samples_per_s = 0.0;         // since the last line
  double elapsed = 0.0;               // seconds of training so far
};

// "epoch 1/3  step 200/1407  loss 0.4321  lr 0.1  3120 samples/s  ETA 1:23"
std::string format_progress(const ProgressState& s);

}  // namespace kiln::io
