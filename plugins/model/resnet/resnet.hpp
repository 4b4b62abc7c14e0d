// The ResNet model: stem → layer1 … layerN → global average pool → fc. Parameter names are
// torchvision's with the stem's prefixed: stem.conv1.weight, stem.bn1.*, layer1.0.conv1.weight,
// layer2.0.downsample.0.weight, fc.weight, fc.bias. The pre-activation variant adds the final
// norm+act before pooling as "bn" and its small stem is a bare conv.
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
  bool preact = false;          // pre-activation BasicBlocks (ResNet v2)
  Activation activation;        // after every norm that is followed by an activation
  bool imagenet_stem = false;   // conv7x7/2 + maxpool instead of a conv3x3/1 stem
  int64_t stem_width = 0;       // channels out of the stem
  std::vector<int64_t> planes;  // per stage: block width (before expansion)
  std::vector<int64_t> blocks;  // per stage: number of blocks
  int64_t in_channels = 0;
  int64_t num_classes = 0;
};

// conv → norm+act (→ maxpool for the ImageNet stem); a bare conv for the small pre-activation
// stem, whose first block starts with norm+act.
class Stem : public torch::nn::Module {
 public:
  Stem(const BlockSetup& setup, int64_t in_channels, int64_t width, bool imagenet, bool bare);
  at::Tensor forward(const at::Tensor& input);

 private:
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<kiln::NormLayer> bn1_;
  bool maxpool_;
};

class ResNet : public kiln::Model {
 public:
  ResNet(const kiln::NormSource& norms, const ResNetConfig& config);
  at::Tensor forward(const at::Tensor& input) override;

 private:
  std::shared_ptr<Stem> stem_;
  std::vector<std::shared_ptr<Stage>> stages_;
  std::shared_ptr<kiln::NormLayer> final_norm_;  // pre-activation only
  std::shared_ptr<Linear> fc_;
};

}  // namespace kiln_resnet
