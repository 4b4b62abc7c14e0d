// `kiln lr-schedule`: the learning rate of every parameter group at every iteration of a
// pipeline's run, computed without training (the model is built to know its groups; the data
// is read only to know the epoch length).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/pipeline.hpp"
#include "engine/lr_driver.hpp"

namespace kiln::engine {

struct LrTable {
  std::vector<std::string> groups;       // group names
  std::vector<std::vector<double>> lrs;  // lrs[i][g]: iteration i+1, group g
  ScheduleFrame frame;                   // the run's, as the trainer computes it
  // For a policy that reacts to evaluations (ABI 1.15): what the rates assume (no evaluation,
  // or the evaluations replayed from a metrics file). Empty for a pure policy.
  std::string note;
};

// Micro-batches per epoch of the run's training loader (data.batch_size, drop_last), counted
// without training: a synthetic dataset is made one pixel per image, Fashion-MNIST is read.
int64_t train_batches_per_epoch(const config::Pipeline& pipeline);

// `iters` > 0 overrides the run's length (max_iters of the schedule too). `metrics` (a run's
// metrics file, "" for none): its evaluation lines are replayed into a policy that reacts to
// evaluations, each before the step after it, as the run did. Throws std::runtime_error naming
// the file when it cannot be read.
LrTable lr_table(const config::Pipeline& pipeline, int64_t iters = 0,
                 const std::string& metrics = "");

std::string format_lr_table(const LrTable& table, bool csv);
void plot_lr_table(const LrTable& table, const std::string& png_path);

}  // namespace kiln::engine
