// A hidden layer's linear and relu as one autograd node: relu(x·Wᵀ + b).
//
// Why: the MLP's layers are small, so a step is bound by dispatch and autograd bookkeeping, not
// arithmetic. at::linear + at::relu records three nodes per layer (the weight's transpose, addmm,
// relu) and hands the weight a transposed gradient that AccumulateGrad then copies. Here the relu
// runs in place on the product, one node saves (x, W, y), and its backward writes each gradient
// in the parameter's own layout. Same arithmetic as torch's nodes: addmm, then relu; on the way
// back threshold_backward, g·W, gᵀ·x and Σg.
#pragma once

#include <ATen/core/Tensor.h>

namespace kiln_mlp {

// relu(input·weightᵀ + bias) for a 2-D input, differentiable in all three. Falls back to
// at::linear + at::relu where the fused node does not apply (autocast, mixed dtypes, no grad).
at::Tensor linear_relu(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace kiln_mlp
