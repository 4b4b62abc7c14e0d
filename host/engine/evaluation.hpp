// Test-split accuracy and loss, the forward run as in training (dtype, autocast, layout). In a
// distributed run each rank evaluates its shard and the sums are all-reduced.
#pragma once

#include "engine/window_pass.hpp"

namespace kiln::dist {
class ProcessGroup;
}

namespace kiln::engine {

struct Evaluation {
  double accuracy = 0.0;  // fraction in [0, 1]; NaN when the split is empty
  double loss = 0.0;      // mean cross-entropy
};

// `in.loader` is the test loader; `in.updates` is not used. `group` may be null.
Evaluation evaluate_model(const WindowInputs& in, dist::ProcessGroup* group);

}  // namespace kiln::engine
