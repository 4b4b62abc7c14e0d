#include "mlp.hpp"

#include <ATen/ops/dropout.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/relu.h>
#include <torch/nn/init.h>

#include <cmath>

#include "linear_relu.hpp"

namespace kiln_mlp {

Linear::Linear(int64_t in_features, int64_t out_features) {
  // torch.nn.Linear.reset_parameters: kaiming_uniform_(a=√5), bias ~ U(±1/√fan_in).
  at::Tensor weight = at::empty({out_features, in_features});
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  at::Tensor bias = at::empty({out_features}).uniform_(-bound, bound);
  weight_ = register_parameter("weight", weight);
  bias_ = register_parameter("bias", bias);
}

at::Tensor Linear::forward(const at::Tensor& input) { return at::linear(input, weight_, bias_); }

at::Tensor Linear::forward_relu(const at::Tensor& input) {
  return linear_relu(input, weight_, bias_);
}

HiddenLayer::HiddenLayer(const kiln::NormSource& norms, int64_t in_features, int64_t out_features,
                         bool norm, double dropout)
    : dropout_(dropout) {
  linear_ = register_module("linear", std::make_shared<Linear>(in_features, out_features));
  if (norm) {
    // The norm layer applies the relu itself, so a fusing norm plugin can do both in one pass.
    norm_ = register_module("norm", kiln::make_norm_layer(norms, out_features, KILN_ACT_RELU));
  }
}

at::Tensor HiddenLayer::forward(const at::Tensor& input) {
  at::Tensor x = norm_ ? norm_->forward(linear_->forward(input)) : linear_->forward_relu(input);
  if (dropout_ > 0.0) x = at::dropout(x, dropout_, is_training());
  return x;
}

Mlp::Mlp(const kiln::NormSource& norms, const MlpConfig& config) {
  layers_ = register_module("layers", std::make_shared<kiln::BlockChain>());
  int64_t in = config.in_features;
  for (int64_t width : config.hidden) {
    layers_->add(std::make_shared<HiddenLayer>(norms, in, width, config.norm, config.dropout));
    in = width;
  }
  const int64_t last = config.hidden.empty() ? config.in_features : config.hidden.back();
  head_ = register_module("head", std::make_shared<Linear>(last, config.num_classes));
}

at::Tensor Mlp::forward(const at::Tensor& input) {
  return head_->forward(layers_->forward(input.flatten(1)));
}

}  // namespace kiln_mlp
