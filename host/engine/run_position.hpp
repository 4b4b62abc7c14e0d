// Where a run is: after `step` optimizer steps, about to take batch `batches_in_epoch` of
// `epoch` (1-based). A checkpoint saves it; a resume continues from it.
#pragma once

#include <cstdint>

namespace kiln::engine {

struct RunPosition {
  int64_t step = 0;
  int64_t epoch = 1;
  int64_t batches_in_epoch = 0;
};

}  // namespace kiln::engine
