// The ResNet model: stem → layer1 … layerN → global average pool → fc. Parameter and buffer
// names and shapes are torchvision's (conv1.weight, bn1.*, layer1.0.conv1.weight,
// layer2.0.downsample.0.weight, fc.weight, fc.bias), so a torchvision state_dict loads with
// model.init (its num_batches_tracked buffers aside). The pre-activation variant adds the final
// norm+act before pooling as "bn" and its small stem is a bare conv1 (no bn1).
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

class ResNet : public kiln::Model {
 public:
  ResNet(const kiln::NormSource& norms, const ResNetConfig& config);
  at::Tensor forward(const at::Tensor& input) override;

 private:
  // The stem, registered on the model itself as torchvision does: conv1 → bn1+act (→ maxpool
  // for the ImageNet stem); bn1 is null for the small pre-activation stem, whose first block
  // starts with norm+act.
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<kiln::NormLayer> bn1_;
  bool maxpool_ = false;
  std::vector<std::shared_ptr<Stage>> stages_;
  std::shared_ptr<kiln::NormLayer> final_norm_;  // pre-activation only
  std::shared_ptr<Linear> fc_;
};

}  // namespace kiln_resnet
