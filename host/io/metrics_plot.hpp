// `kiln plot`: training curves from the JSON-lines metrics file (io/metrics.hpp) as one PNG.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/plot.hpp"

namespace kiln::io {

// The fields of the metrics file that the plot uses; a JSON null (or an absent optional field)
// reads as NaN.
struct MetricsStep {
  int64_t step = 0;
  int64_t epoch = 0;
  double loss = 0.0;
  std::vector<double> lr;  // per parameter group
  double loss_scale = 0.0;
  double grad_norm = 0.0;
  bool skipped = false;
};

struct MetricsEval {
  int64_t epoch = 0;
  int64_t step = 0;
  double accuracy = 0.0;  // fraction in [0, 1]
  double loss = 0.0;
  double top5 = 0.0;  // fraction in [0, 1]; NaN when the line has none
  double map = 0.0;   // multi-label: mean average precision in [0, 1]; NaN otherwise
};

struct MetricsLog {
  std::vector<MetricsStep> steps;
  std::vector<MetricsEval> evals;
  std::vector<std::string> lr_groups;  // names of the lr entries, from the last step naming them
};

// Reads a metrics file. Records of other types are ignored, and so is a last line that is cut
// short (the trainer may be writing it). When a step comes back at or below an earlier one (a
// resumed run appending to the same file) the records it repeats are replaced, so the curves stay
// functions of the step. Throws std::runtime_error naming the file, and the line where there is
// one, for a file that cannot be read, a line that is not JSON or lacks a required field, and a
// file without step records.
MetricsLog read_metrics(const std::string& path);

// The panels: training loss with its moving mean and the evaluations' loss; test accuracy in %
// per evaluation, by epoch (when there are evaluations); the learning rate of every group, named
// as the metrics name them ("group <i>" in files that do not); log2 of the loss scale (when it
// changes).
std::vector<Panel> metrics_panels(const MetricsLog& log);

// Writes the panels of `metrics_path` to `png_path` (900 px wide, 360 px per panel). Throws
// std::runtime_error as read_metrics does, or naming `png_path` when it cannot be written.
void plot_metrics(const std::string& metrics_path, const std::string& png_path);

}  // namespace kiln::io
