// Test-split accuracy (top-1 and top-5) and loss, or for multi-label data mean average precision
// and loss; the forward run as in training (dtype, autocast, layout) and the loss the run trains
// with (engine/loss.hpp). In a distributed run each rank evaluates its shard and the sums are
// all-reduced (multi-label: the scores and targets gathered).
#pragma once

#include <limits>

#include "engine/window_pass.hpp"

namespace kiln::dist {
class ProcessGroup;
}

namespace kiln::engine {

struct Evaluation {
  double accuracy = 0.0;       // top-1, fraction in [0, 1]; NaN when the split is empty
  double loss = 0.0;           // the run's loss over the split (Loss::sums' ratio)
  double accuracy_top5 = 0.0;  // top-k with k = min(5, classes); NaN when the split is empty
  // Multi-label data: mean average precision in [0, 1] (engine/average_precision.hpp), and the
  // accuracies NaN; NaN for data of one class per sample.
  double map = std::numeric_limits<double>::quiet_NaN();
  bool multi_label = false;  // the split has target rows
};

// `in.loader` is the test loader, `in.loss` the run's loss; `in.updates` is not used. `group`
// may be null.
Evaluation evaluate_model(const WindowInputs& in, dist::ProcessGroup* group);

}  // namespace kiln::engine
