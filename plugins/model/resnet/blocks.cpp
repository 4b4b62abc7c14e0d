#include "blocks.hpp"

#include <ATen/ops/relu.h>

#include <string>

namespace kiln_resnet {

Downsample::Downsample(const kiln_host_api* host, int64_t in_channels, int64_t out_channels,
                       int64_t stride) {
  conv_ = register_module("0", std::make_shared<Conv2d>(in_channels, out_channels, 1, stride));
  norm_ = register_module("1", kiln::make_norm_layer(host, out_channels, KILN_ACT_NONE));
}

at::Tensor Downsample::forward(const at::Tensor& input) {
  return norm_->forward(conv_->forward(input));
}

at::Tensor ResidualBlock::merge(const at::Tensor& residual, const at::Tensor& input) const {
  at::Tensor sum = residual + (downsample_ ? downsample_->forward(input) : input);
  // In place is safe: the sum is a fresh tensor no one else holds.
  return at::relu_(sum);
}

BasicBlock::BasicBlock(const kiln_host_api* host, int64_t in_channels, int64_t planes,
                       int64_t stride) {
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(in_channels, planes, 3, stride));
  bn1_ = register_module("bn1", kiln::make_norm_layer(host, planes, KILN_ACT_RELU));
  conv2_ = register_module("conv2", std::make_shared<Conv2d>(planes, planes, 3, 1));
  bn2_ = register_module("bn2", kiln::make_norm_layer(host, planes, KILN_ACT_NONE));
  if (stride != 1 || in_channels != planes * kExpansion) {
    downsample_ = register_module(
        "downsample", std::make_shared<Downsample>(host, in_channels, planes * kExpansion, stride));
  }
}

at::Tensor BasicBlock::forward(const at::Tensor& input) {
  at::Tensor x = bn1_->forward(conv1_->forward(input));
  x = bn2_->forward(conv2_->forward(x));
  return merge(x, input);
}

Bottleneck::Bottleneck(const kiln_host_api* host, int64_t in_channels, int64_t planes,
                       int64_t stride) {
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(in_channels, planes, 1, 1));
  bn1_ = register_module("bn1", kiln::make_norm_layer(host, planes, KILN_ACT_RELU));
  conv2_ = register_module("conv2", std::make_shared<Conv2d>(planes, planes, 3, stride));
  bn2_ = register_module("bn2", kiln::make_norm_layer(host, planes, KILN_ACT_RELU));
  conv3_ = register_module("conv3", std::make_shared<Conv2d>(planes, planes * kExpansion, 1, 1));
  bn3_ = register_module("bn3", kiln::make_norm_layer(host, planes * kExpansion, KILN_ACT_NONE));
  if (stride != 1 || in_channels != planes * kExpansion) {
    downsample_ = register_module(
        "downsample", std::make_shared<Downsample>(host, in_channels, planes * kExpansion, stride));
  }
}

at::Tensor Bottleneck::forward(const at::Tensor& input) {
  at::Tensor x = bn1_->forward(conv1_->forward(input));
  x = bn2_->forward(conv2_->forward(x));
  x = bn3_->forward(conv3_->forward(x));
  return merge(x, input);
}

Stage::Stage(const kiln_host_api* host, bool bottleneck, int64_t& in_channels, int64_t planes,
             int64_t count, int64_t stride) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t block_stride = i == 0 ? stride : 1;
    std::shared_ptr<ResidualBlock> block;
    if (bottleneck) {
      block = std::make_shared<Bottleneck>(host, in_channels, planes, block_stride);
      in_channels = planes * Bottleneck::kExpansion;
    } else {
      block = std::make_shared<BasicBlock>(host, in_channels, planes, block_stride);
      in_channels = planes * BasicBlock::kExpansion;
    }
    blocks_.push_back(register_module(std::to_string(i), block));
  }
}

at::Tensor Stage::forward(at::Tensor input) {
  for (const auto& block : blocks_) input = block->forward(input);
  return input;
}

}  // namespace kiln_resnet
