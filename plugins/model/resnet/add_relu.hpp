// relu(a + b) as one pass over the data on the CPU (ATen's vectorised `_add_relu`), for the
// residual merge of a block: eager's add then relu_ reads and writes the sum twice. Backward is
// relu's own (the mask of the kept output), handed to both summands.
#pragma once

#include <ATen/core/Tensor.h>

namespace kiln_resnet {

// Whether add_relu takes these summands: CPU float32 of the same sizes, dtype and layout.
bool add_relu_fits(const at::Tensor& a, const at::Tensor& b);

// relu(a + b), differentiable in both; the result is a fresh tensor.
at::Tensor add_relu(const at::Tensor& a, const at::Tensor& b);

}  // namespace kiln_resnet
