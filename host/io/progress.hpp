// Progress lines with throughput and ETA: plain lines at an interval of steps for logs, and a
// one-line bar for the terminal's status line (io/status_line).
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
  double elapsed = 0.0;               // seconds of training in this process so far
  int64_t first_step = 0;             // steps done before it (a resumed run's checkpoint): the
                                      // ETA is the rate of the steps after them
};

// Seconds left at the rate of this process's steps so far; NaN before its first step.
double eta_seconds(const ProgressState& s);

// "epoch 1/3  step 200/1407  loss 0.4321  lr 0.1  3120 samples/s  ETA 1:23"
std::string format_progress(const ProgressState& s);

// "epoch 1/3 [#######.........]  42%  step 590/1407  loss 0.4321  lr 0.1  3120 samples/s  ETA
// 1:23" in at most `width` columns: the bar shrinks first (to 10 cells), then fields are dropped
// (samples/s, lr, step, epoch, loss, then the bar itself), and as a last resort the line is cut.
// The fill is step / total_steps, rounded down, so the bar is full only at the last step.
std::string format_progress_bar(const ProgressState& s, int width);

}  // namespace kiln::io
