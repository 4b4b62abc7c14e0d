// Residual blocks and stages. Child names follow torchvision (conv1, bn1, …, downsample.0/1) so
// parameter names line up with torchvision's below the stage ("layer1.0.conv1.weight").
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/torch.hpp"
#include "layers.hpp"

namespace kiln_resnet {

// The projection shortcut: conv1x1 (stride) → norm, registered as "0" and "1".
class Downsample : public torch::nn::Module {
 public:
  Downsample(const kiln_host_api* host, int64_t in_channels, int64_t out_channels, int64_t stride);
  at::Tensor forward(const at::Tensor& input);

 private:
  std::shared_ptr<Conv2d> conv_;
  std::shared_ptr<kiln::NormLayer> norm_;
};

class ResidualBlock : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& input) = 0;

 protected:
  // relu(residual + shortcut(input)); the shortcut is the identity when there is no downsample.
  at::Tensor merge(const at::Tensor& residual, const at::Tensor& input) const;
  std::shared_ptr<Downsample> downsample_;
};

// conv3x3 (stride) → norm+relu → conv3x3 → norm, plus the shortcut, then relu.
class BasicBlock : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(const kiln_host_api* host, int64_t in_channels, int64_t planes, int64_t stride);
  at::Tensor forward(const at::Tensor& input) override;

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_;
  std::shared_ptr<kiln::NormLayer> bn1_, bn2_;
};

// conv1x1 → norm+relu → conv3x3 (stride) → norm+relu → conv1x1 (×4) → norm, plus the shortcut,
// then relu (torchvision's ResNet v1.5: the stride sits on the 3×3 conv).
class Bottleneck : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(const kiln_host_api* host, int64_t in_channels, int64_t planes, int64_t stride);
  at::Tensor forward(const at::Tensor& input) override;

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_, conv3_;
  std::shared_ptr<kiln::NormLayer> bn1_, bn2_, bn3_;
};

// A stage ("layerN"): blocks registered as "0", "1", …
class Stage : public torch::nn::Module {
 public:
  // Builds `count` blocks of `planes`; the first has `stride`. `in_channels` is updated to the
  // stage's output channels.
  Stage(const kiln_host_api* host, bool bottleneck, int64_t& in_channels, int64_t planes,
        int64_t count, int64_t stride);
  at::Tensor forward(at::Tensor input);

 private:
  std::vector<std::shared_ptr<ResidualBlock>> blocks_;
};

}  // namespace kiln_resnet
