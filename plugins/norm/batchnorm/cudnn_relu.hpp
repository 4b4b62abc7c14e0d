// The batchnorm component's fused route on CUDA: a training layer followed by a ReLU, on AMP's half
// channels-last data, runs as cuDNN's batch norm + activation (CUDNN_BATCHNORM_OPS_BN_ACTIVATION):
// one forward kernel writes relu(BN(x)) and one backward kernel takes the gradient through both,
// where PyTorch runs cuDNN's batch norm and then ATen's ReLU and its backward (a read and a write
// of the activations each way). The backward needs the forward's input and output: the layer asks
// the host to keep both (KILN_NORM_SAVE_INPUT_AND_OUTPUT, ABI 1.12), as torch's in-place ReLU kept
// the output before. cuDNN's bitmask reserve goes to the host like the plain route's
// (cudnn_route.hpp), as int8 where that route's is uint8, so the backward knows which forward ran.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

#include "kiln/norm.h"

namespace kiln::norm::cudnn {

// Whether a layer with this setup applies its ReLU itself on CUDA: the run trains on CUDA, the
// model asks for a ReLU, the host keeps input and output (abi_minor 12 or later), `enabled` (the
// "fused" option), and every cuDNN function the route calls was found in the loaded libcudnn. The
// layer must then apply the ReLU wherever the fused route cannot run.
bool fuses_relu(const kiln_host_api* host, const kiln_norm_setup* setup, bool enabled);

// The training forward with the ReLU, writing the host's output, saved statistics and running
// statistics (as cudnn::forward) and handing cuDNN's reserve over. False, having written nothing,
// where cuDNN's fused kernel does not take the data (then the caller runs another route and
// applies the ReLU); a kiln::Error where cuDNN fails the call.
bool relu_forward(const kiln_norm_forward_args* args, const at::Tensor& x, const at::Tensor& output,
                  const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& running_mean,
                  const at::Tensor& running_var, double momentum, double eps);

// The backward of a forward that took this route: gradients for input, weight and bias of
// `grad_output`, the gradient at the ReLU's output. False when the forward took another route.
bool relu_backward(const kiln_norm_backward_args* args, const at::Tensor& x,
                   const at::Tensor& grad_output, double eps,
                   std::tuple<at::Tensor, at::Tensor, at::Tensor>& grads);

}  // namespace kiln::norm::cudnn
