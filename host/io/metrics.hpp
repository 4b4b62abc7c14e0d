// Metrics as JSON lines: one object per training step and per evaluation.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "io/buffered_file.hpp"

namespace kiln::io {

struct StepRecord {
  int64_t step = 0;   // 1-based optimizer step
  int64_t epoch = 0;  // 1-based
  double loss = 0.0;
  std::vector<double> lr;  // per parameter group
  double step_time = 0.0;  // seconds: zero_grad, forward, backward, optimizer, the loss read
  double data_time = 0.0;  // seconds waiting for the batch
  double samples_per_s = 0.0;
  double started = 0.0;       // seconds since training began, when this step began
  double loss_scale = 1.0;    // the scale this step's loss was multiplied by
  double grad_norm = 0.0;     // global norm of the unscaled gradients, before clipping; NaN on
                              // a step without the gradient pass (run.grad_check)
  bool skipped = false;       // non-finite gradients or loss: the optimizer did not run
  int64_t skipped_total = 0;  // skipped steps so far in the run
  int64_t micro_batches = 1;  // accumulated into this step
  double memory_mb = 0.0;     // peak memory so far, MiB (io/memory.hpp says of what); NaN on a
                              // step that did not read it (the CPU's is read on logged steps)
  // Tensor storage on the run's device, MiB (counted by Kiln: io/memory.hpp): live at the end
  // of the step (weights, gradients, optimizer state), the step's peak, and that peak above
  // what was live when the step began (weights and optimizer state; gradients are released
  // between steps): the activations forward and backward held at their worst, with the
  // gradients backward had created by then.
  double tensor_mb = 0.0;
  double tensor_peak_mb = 0.0;
  double activation_mb = 0.0;
  int64_t allreduces = 0;  // gradient all-reduces issued in this step (0: one process)
  // Extra forward and backward passes of the window the optimizer asked for (SAM: 1); written
  // to the metrics file only when nonzero.
  int64_t reevaluations = 0;
};

struct EvalRecord {
  int64_t epoch = 0;
  int64_t step = 0;
  double accuracy = 0.0;       // top-1, fraction in [0, 1]
  double loss = 0.0;           // the run's loss over the split
  double accuracy_top5 = 0.0;  // top-5 (top-min(5, classes)), fraction in [0, 1]
  // Multi-label data: mean average precision in [0, 1] (the accuracies are then NaN); NaN for
  // data of one class per sample.
  double map = std::numeric_limits<double>::quiet_NaN();
  bool multi_label = false;  // the split has target rows: map is its metric (NaN if it failed)
  bool averaged = false;     // of the weights' moving average ([ema]), not the trained weights
};

// Buffered: step lines go to the OS once 64 KiB or a second old, with an evaluation, on flush()
// (the trainer's, before each checkpoint) and on destruction. A write is a system call, which
// costs a dispatch-bound CPU step more than its own time (docs/speed.md), so lines are not
// written one per step. Only whole lines are written; reopening to append drops a partial last
// line that a crash in the middle of a write left.
class MetricsWriter {
 public:
  // An empty path writes nothing. Throws std::runtime_error naming the path if the file cannot
  // be opened. `append`: continue an existing file (a resumed run) instead of starting afresh.
  explicit MetricsWriter(const std::string& path, bool append = false);

  // Each throws std::runtime_error naming the path when writing to the OS fails.
  void write(const StepRecord& r);
  void write(const EvalRecord& r);  // written through at once
  void flush();                     // writes the buffered lines to the OS
  bool enabled() const { return file_.is_open(); }
  // The parameter groups' names, written into every later step line as "lr_groups" next to
  // "lr" (in its order), so that a reader names the rates as `kiln lr-schedule` and TensorBoard
  // do, from any part of the file.
  void set_lr_groups(const std::vector<std::string>& names);

 private:
  BufferedFile file_;      // flushed (a failure logged) and closed on destruction
  std::string lr_groups_;  // the names as a JSON array; empty: not written
};

}  // namespace kiln::io
