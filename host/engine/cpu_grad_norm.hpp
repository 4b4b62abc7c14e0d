// The global 2-norm of dense float32 CPU gradients in one pass over their memory, without a
// kernel launch per tensor: _foreach_norm has no multi-tensor CPU kernel, and on a model of many
// small layers its per-tensor dispatch costs more than the arithmetic.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace kiln::engine {

// sqrt(Σ g²) over every element of `grads` (contiguous float32 CPU tensors). Chunks are summed on
// torch's intra-op threads and combined in a fixed order, so the result does not depend on the
// thread count. A NaN or inf in any element makes it non-finite, the check the caller needs.
double cpu_float_norm2(const std::vector<at::Tensor>& grads);

}  // namespace kiln::engine
