// The weight layers ResNets are built from, initialised like their torch.nn counterparts.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>

namespace kiln_resnet {

// k×k convolution without bias (a norm layer always follows), padding k/2, run in its weight's
// layout (NCHW or NHWC, whatever the input's).
class Conv2d : public torch::nn::Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride);
  at::Tensor forward(const at::Tensor& input);

 private:
  at::Tensor weight_;
  int64_t stride_;
  int64_t padding_;
};

// y = x·Wᵀ + b.
class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in_features, int64_t out_features);
  at::Tensor forward(const at::Tensor& input);

 private:
  at::Tensor weight_;
  at::Tensor bias_;
};

}  // namespace kiln_resnet
