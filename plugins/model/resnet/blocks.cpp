#include "blocks.hpp"

#include <ATen/ops/elu.h>
#include <ATen/ops/leaky_relu.h>
#include <ATen/ops/relu.h>

#include "add_relu.hpp"

namespace kiln_resnet {

at::Tensor Activation::apply_(at::Tensor& x) const {
  switch (kind) {
    case KILN_ACT_LEAKY_RELU:
      return at::leaky_relu_(x, param);
    case KILN_ACT_ELU:
      return at::elu_(x, param);
    default:
      return at::relu_(x);
  }
}

std::shared_ptr<kiln::NormLayer> BlockSetup::norm(int64_t features, bool activate,
                                                  bool overwrites) const {
  return kiln::make_norm_layer(norms, features, activate ? activation.kind : KILN_ACT_NONE,
                               activate ? activation.param : 0.0, overwrites);
}

Downsample::Downsample(const BlockSetup& setup, int64_t in_channels, int64_t out_channels,
                       int64_t stride, bool with_norm) {
  conv_ = register_module("0", std::make_shared<Conv2d>(in_channels, out_channels, 1, stride));
  if (with_norm) norm_ = register_module("1", setup.norm(out_channels, false, true));
}

at::Tensor Downsample::forward(const at::Tensor& input) {
  at::Tensor x = conv_->forward(input);
  return norm_ ? norm_->forward(x) : x;
}

at::Tensor ResidualBlock::merge(const at::Tensor& residual, const at::Tensor& input) const {
  const at::Tensor shortcut = downsample_ ? downsample_->forward(input) : input;
  if (activation_.kind == KILN_ACT_RELU && add_relu_fits(residual, shortcut)) {
    return add_relu(residual, shortcut);
  }
  at::Tensor sum = residual + shortcut;
  // In place is safe: the sum is a fresh tensor no one else holds.
  return activation_.apply_(sum);
}

BasicBlock::BasicBlock(const BlockSetup& setup, int64_t in_channels, int64_t planes,
                       int64_t stride) {
  activation_ = setup.activation;
  // Conv outputs feed only their norm, so in-place norms may overwrite them.
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(in_channels, planes, 3, stride));
  bn1_ = register_module("bn1", setup.norm(planes, true, true));
  conv2_ = register_module("conv2", std::make_shared<Conv2d>(planes, planes, 3, 1));
  bn2_ = register_module("bn2", setup.norm(planes, false, true));
  if (stride != 1 || in_channels != planes * kExpansion) {
    downsample_ = register_module(
        "downsample",
        std::make_shared<Downsample>(setup, in_channels, planes * kExpansion, stride, true));
  }
}

at::Tensor BasicBlock::forward(const at::Tensor& input) {
  at::Tensor x = bn1_->forward(conv1_->forward(input));
  x = bn2_->forward(conv2_->forward(x));
  return merge(x, input);
}

Bottleneck::Bottleneck(const BlockSetup& setup, int64_t in_channels, int64_t planes,
                       int64_t stride) {
  activation_ = setup.activation;
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(in_channels, planes, 1, 1));
  bn1_ = register_module("bn1", setup.norm(planes, true, true));
  conv2_ = register_module("conv2", std::make_shared<Conv2d>(planes, planes, 3, stride));
  bn2_ = register_module("bn2", setup.norm(planes, true, true));
  conv3_ = register_module("conv3", std::make_shared<Conv2d>(planes, planes * kExpansion, 1, 1));
  bn3_ = register_module("bn3", setup.norm(planes * kExpansion, false, true));
  if (stride != 1 || in_channels != planes * kExpansion) {
    downsample_ = register_module(
        "downsample",
        std::make_shared<Downsample>(setup, in_channels, planes * kExpansion, stride, true));
  }
}

at::Tensor Bottleneck::forward(const at::Tensor& input) {
  at::Tensor x = bn1_->forward(conv1_->forward(input));
  x = bn2_->forward(conv2_->forward(x));
  x = bn3_->forward(conv3_->forward(x));
  return merge(x, input);
}

PreActBlock::PreActBlock(const BlockSetup& setup, int64_t in_channels, int64_t planes,
                         int64_t stride) {
  const bool project = stride != 1 || in_channels != planes * kExpansion;
  // With the identity shortcut the block input is read again after bn1, so bn1 must leave it.
  bn1_ = register_module("bn1", setup.norm(in_channels, true, project));
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(in_channels, planes, 3, stride));
  bn2_ = register_module("bn2", setup.norm(planes, true, true));
  conv2_ = register_module("conv2", std::make_shared<Conv2d>(planes, planes, 3, 1));
  if (project) {
    downsample_ = register_module(
        "downsample",
        std::make_shared<Downsample>(setup, in_channels, planes * kExpansion, stride, false));
  }
}

at::Tensor PreActBlock::forward(const at::Tensor& input) {
  at::Tensor a = bn1_->forward(input);
  at::Tensor shortcut = downsample_ ? downsample_->forward(a) : input;
  at::Tensor x = conv2_->forward(bn2_->forward(conv1_->forward(a)));
  // The conv output is fresh and saved by no one: add in place.
  return x.add_(shortcut);
}

Stage::Stage(const BlockSetup& setup, BlockKind kind, int64_t& in_channels, int64_t planes,
             int64_t count, int64_t stride) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t block_stride = i == 0 ? stride : 1;
    switch (kind) {
      case BlockKind::kBottleneck:
        add(std::make_shared<Bottleneck>(setup, in_channels, planes, block_stride));
        in_channels = planes * Bottleneck::kExpansion;
        break;
      case BlockKind::kPreAct:
        add(std::make_shared<PreActBlock>(setup, in_channels, planes, block_stride));
        in_channels = planes * PreActBlock::kExpansion;
        break;
      case BlockKind::kBasic:
        add(std::make_shared<BasicBlock>(setup, in_channels, planes, block_stride));
        in_channels = planes * BasicBlock::kExpansion;
        break;
    }
  }
}

}  // namespace kiln_resnet
