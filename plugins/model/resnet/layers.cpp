#include "layers.hpp"

#include <ATen/ops/conv2d.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/nn/init.h>

#include <cmath>

namespace kiln_resnet {
namespace {

// torch.nn's reset_parameters for conv and linear weights: kaiming_uniform_(a=√5).
at::Tensor default_weight(at::IntArrayRef shape) {
  at::Tensor weight = at::empty(shape);
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  return weight;
}

}  // namespace

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride)
    : stride_(stride), padding_(kernel / 2) {
  weight_ =
      register_parameter("weight", default_weight({out_channels, in_channels, kernel, kernel}));
}

at::Tensor Conv2d::forward(const at::Tensor& input) {
  // The convolution runs in its weight's layout: in a channels-last model on the CPU the host
  // keeps some weights NCHW (small maps, many channels: oneDNN's blocked kernels are faster
  // there), and ATen runs any convolution with a channels-last input in NHWC. A 1x1 weight is
  // both layouts at once and leaves the input as it is.
  const bool nchw = !weight_.is_contiguous(at::MemoryFormat::ChannelsLast);
  return at::conv2d(nchw ? input.contiguous() : input, weight_, {}, {stride_, stride_},
                    {padding_, padding_});
}

Linear::Linear(int64_t in_features, int64_t out_features) {
  weight_ = register_parameter("weight", default_weight({out_features, in_features}));
  // torch.nn.Linear: bias ~ U(±1/√fan_in).
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  bias_ = register_parameter("bias", at::empty({out_features}).uniform_(-bound, bound));
}

at::Tensor Linear::forward(const at::Tensor& input) { return at::linear(input, weight_, bias_); }

}  // namespace kiln_resnet
