// The batchnorm component's cuDNN route: on CUDA, training with batch statistics, a layer runs on
// cuDNN exactly where ATen's own batch_norm would (at::native::_select_batch_norm_backend), so a
// Kiln model gets the kernels a PyTorch model gets (for AMP's half input with float parameters,
// cuDNN's NHWC batch norm instead of ATen's four channels-last kernels). cuDNN's backward needs
// the reserve space its forward filled: the forward hands it to the host (ABI 1.11,
// kiln_norm_forward_args.reserve_result), which lends it back to the backward.
#pragma once

#include <ATen/core/Tensor.h>

#include "kiln/norm.h"

namespace kiln::norm::cudnn {

// The training forward on cuDNN, writing the host's output, saved statistics and running
// statistics (`running_mean`/`running_var`: the layer's, the report's, or undefined) with
// `momentum`, and handing the reserve over. False, having done nothing, where ATen would not
// take cuDNN or the host cannot keep the reserve (then the caller runs ATen's native kernels).
bool forward(const kiln_norm_forward_args* args, const at::Tensor& x, const at::Tensor& output,
             const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& running_mean,
             const at::Tensor& running_var, double momentum, double eps);

// The backward of a forward that took cuDNN (the host lent its reserve back): gradients for input,
// weight and bias of `grad_output` (already through the activation). False when the forward did
// not take cuDNN.
bool backward(const kiln_norm_backward_args* args, const at::Tensor& x,
              const at::Tensor& grad_output, const at::Tensor& weight, double eps,
              std::tuple<at::Tensor, at::Tensor, at::Tensor>& grads);

}  // namespace kiln::norm::cudnn
