// The ResNet model: stem → layer1 … layerN → global average pool → fc. Parameter names are
// torchvision's with the stem's prefixed: stem.conv1.weight, stem.bn1.*, layer1.0.conv1.weight,
// layer2.0.downsample.0.weight, fc.weight, fc.bias.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "blocks.hpp"
#include "kiln/torch.hpp"
#include "layers.hpp"

namespace kiln_resnet {

// What to build, resolved from the options and the input (see resolve_config in plugin.cpp).
struct ResNetConfig {
  bool bottleneck = false;      // Bottleneck blocks (expansion 4) instead of BasicBlocks
  bool imagenet_stem = false;   // conv7x7/2 + maxpool instead of a conv3x3/1 stem
  int64_t stem_width = 0;       // channels out of the stem
  std::vector<int64_t> planes;  // per stage: block width (before expansion)
  std::vector<int64_t> blocks;  // per stage: number of blocks
  int64_t in_channels = 0;
  int64_t num_classes = 0;
};

// conv → norm+relu (→ maxpool for the ImageNet stem).
class Stem : public torch::nn::Module {
 public:
  Stem(const kiln_host_api* host, int64_t in_channels, int64_t width, bool imagenet);
  at::Tensor forward(const at::Tensor& input);

 private:
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<kiln::NormLayer> bn1_;
  bool maxpool_;
};

class ResNet : public kiln::Model {
 public:
  ResNet(const kiln_host_api* host, const ResNetConfig& config);
  at::Tensor forward(const at::Tensor& input) override;
  // "stem", "layer1", "layer2", …
  std::vector<std::string> block_names() const override;

 private:
  std::shared_ptr<Stem> stem_;
  std::vector<std::shared_ptr<Stage>> stages_;
  std::shared_ptr<Linear> fc_;
};

}  // namespace kiln_resnet
