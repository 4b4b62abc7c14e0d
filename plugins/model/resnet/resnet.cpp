#include "resnet.hpp"

#include <ATen/ops/adaptive_avg_pool2d.h>
#include <ATen/ops/max_pool2d.h>

namespace kiln_resnet {

ResNet::ResNet(const kiln::NormSource& norms, const ResNetConfig& config) {
  BlockSetup setup;
  setup.norms = norms;
  setup.activation = config.activation;
  const int64_t width = config.stem_width;
  conv1_ = register_module(
      "conv1", config.imagenet_stem ? std::make_shared<Conv2d>(config.in_channels, width, 7, 2)
                                    : std::make_shared<Conv2d>(config.in_channels, width, 3, 1));
  if (!(config.preact && !config.imagenet_stem)) {
    bn1_ = register_module("bn1", setup.norm(width, true, true));
  }
  maxpool_ = config.imagenet_stem;
  const BlockKind kind = config.preact       ? BlockKind::kPreAct
                         : config.bottleneck ? BlockKind::kBottleneck
                                             : BlockKind::kBasic;
  int64_t channels = config.stem_width;
  for (size_t i = 0; i < config.planes.size(); ++i) {
    const int64_t stride = i == 0 ? 1 : 2;
    stages_.push_back(
        register_module("layer" + std::to_string(i + 1),
                        std::make_shared<Stage>(setup, kind, channels, config.planes[i],
                                                config.blocks[i], stride)));
  }
  if (config.preact) final_norm_ = register_module("bn", setup.norm(channels, true, true));
  fc_ = register_module("fc", std::make_shared<Linear>(channels, config.num_classes));
}

at::Tensor ResNet::forward(const at::Tensor& input) {
  at::Tensor x = conv1_->forward(input);
  if (bn1_) x = bn1_->forward(x);
  if (maxpool_) x = at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  for (const auto& stage : stages_) x = stage->forward(x);
  if (final_norm_) x = final_norm_->forward(x);
  // Global average pool: [N, C, H, W] → [N, C], as torchvision's AdaptiveAvgPool2d((1, 1)).
  // Its backward hands the last block a gradient in the block's own layout (mean's would be
  // NCHW under channels_last, and every layer below would mix layouts).
  return fc_->forward(at::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
}

}  // namespace kiln_resnet
