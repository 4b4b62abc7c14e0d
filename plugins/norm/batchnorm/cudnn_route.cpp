#include "cudnn_route.hpp"

#include <ATen/native/Normalization.h>
#include <ATen/ops/cudnn_batch_norm.h>
#include <ATen/ops/cudnn_batch_norm_backward.h>
#include <ATen/ops/empty.h>

#include <tuple>

#include "kiln/torch.hpp"

namespace kiln::norm::cudnn {

namespace {

bool aten_takes_cudnn(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      const at::Tensor& running_mean, const at::Tensor& running_var, double eps) {
  // The selector reads the weight's dtype before asking whether it is defined.
  if (!x.is_cuda() || !weight.defined() || !bias.defined()) return false;
  return at::native::_select_batch_norm_backend(x, weight, bias, running_mean, running_var,
                                                /*training=*/true,
                                                eps) == at::native::BatchNormBackend::Cudnn;
}

}  // namespace

bool forward(const kiln_norm_forward_args* args, const at::Tensor& x, const at::Tensor& output,
             const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& running_mean,
             const at::Tensor& running_var, double momentum, double eps) {
  // Without a slot for the reserve (a host before 1.11) the backward could not run on cuDNN.
  if (!KILN_HAS_FIELD(args, kiln_norm_forward_args, reserve_result) ||
      args->reserve_result == nullptr || args->save_mean == nullptr ||
      args->save_invstd == nullptr) {
    return false;
  }
  if (!aten_takes_cudnn(x, weight, bias, running_mean, running_var, eps)) return false;
  at::Tensor save_mean = kiln::as_tensor(*args->save_mean);
  at::Tensor save_invstd = kiln::as_tensor(*args->save_invstd);
  // cuDNN writes the output in the input's layout and the statistics in the weight's dtype.
  if (output.strides() != x.strides() || save_mean.scalar_type() != weight.scalar_type() ||
      save_invstd.scalar_type() != weight.scalar_type()) {
    return false;
  }
  at::Tensor y = output;
  at::Tensor reserve = at::empty({0}, x.options().dtype(at::kByte));
  at::cudnn_batch_norm_out(y, save_mean, save_invstd, reserve, x, weight, bias, running_mean,
                           running_var, /*training=*/true, momentum, eps);
  kiln::hand_over(args->reserve_result, reserve);
  return true;
}

bool backward(const kiln_norm_backward_args* args, const at::Tensor& x,
              const at::Tensor& grad_output, const at::Tensor& weight, double eps,
              std::tuple<at::Tensor, at::Tensor, at::Tensor>& grads) {
  // Only this route's forward stores a reserve, and only on CUDA; a CPU layer never takes it.
  if (!KILN_HAS_FIELD(args, kiln_norm_backward_args, reserve) || args->reserve == nullptr ||
      !x.is_cuda()) {
    return false;
  }
  const auto optional = [](const DLTensor* t) {
    return t != nullptr ? kiln::as_tensor(*t) : at::Tensor();
  };
  // cuDNN wants the gradient dense in the input's layout, as its forward wrote the output.
  grads = at::cudnn_batch_norm_backward(
      x, grad_output.contiguous(x.suggest_memory_format()), weight, optional(args->running_mean),
      optional(args->running_var), optional(args->save_mean), optional(args->save_invstd), eps,
      kiln::as_tensor(*args->reserve));
  return true;
}

}  // namespace kiln::norm::cudnn
