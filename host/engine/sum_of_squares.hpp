// The sum of squares of a float32 buffer: the inner loop of the gradient norm.
#pragma once
#include <cstdint>

namespace kiln::engine {

// Σ x[i]² over n floats, accumulated in double across blocks of 1024.
double sum_of_squares(const float* x, int64_t n);

}  // namespace kiln::engine
