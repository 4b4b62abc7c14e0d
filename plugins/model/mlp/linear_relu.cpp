#include "linear_relu.hpp"

#include <ATen/autocast_mode.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/threshold_backward.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace kiln_mlp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearRelu : public torch::autograd::Function<LinearRelu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias) {
    at::Tensor output = at::addmm(bias, input, weight.t()).relu_();
    ctx->save_for_backward({input, weight, output});
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    // relu's gradient: zero where the output is (the same mask torch's ReluBackward uses).
    const at::Tensor grad = at::threshold_backward(grads[0], saved[2], 0);
    at::Tensor grad_input;
    at::Tensor grad_weight;
    at::Tensor grad_bias;
    if (ctx->needs_input_grad(0)) grad_input = grad.mm(weight);
    if (ctx->needs_input_grad(1)) grad_weight = grad.t().mm(input);
    if (ctx->needs_input_grad(2)) grad_bias = grad.sum(0);
    return {grad_input, grad_weight, grad_bias};
  }
};

bool fusable(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) {
  return torch::autograd::GradMode::is_enabled() && input.dim() == 2 && bias.defined() &&
         input.scalar_type() == weight.scalar_type() &&
         bias.scalar_type() == weight.scalar_type() &&
         !at::autocast::is_autocast_enabled(input.device().type());
}

}  // namespace

at::Tensor linear_relu(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) {
  if (!fusable(input, weight, bias)) return at::relu(at::linear(input, weight, bias));
  return LinearRelu::apply(input, weight, bias);
}

}  // namespace kiln_mlp
