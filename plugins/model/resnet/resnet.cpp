#include "resnet.hpp"

#include <ATen/ops/max_pool2d.h>

namespace kiln_resnet {

Stem::Stem(const kiln_host_api* host, int64_t in_channels, int64_t width, bool imagenet)
    : maxpool_(imagenet) {
  conv1_ = register_module("conv1", imagenet ? std::make_shared<Conv2d>(in_channels, width, 7, 2)
                                             : std::make_shared<Conv2d>(in_channels, width, 3, 1));
  bn1_ = register_module("bn1", kiln::make_norm_layer(host, width, KILN_ACT_RELU));
}

at::Tensor Stem::forward(const at::Tensor& input) {
  at::Tensor x = bn1_->forward(conv1_->forward(input));
  return maxpool_ ? at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1}) : x;
}

ResNet::ResNet(const kiln_host_api* host, const ResNetConfig& config) {
  stem_ = register_module("stem", std::make_shared<Stem>(host, config.in_channels,
                                                         config.stem_width, config.imagenet_stem));
  int64_t channels = config.stem_width;
  for (size_t i = 0; i < config.planes.size(); ++i) {
    const int64_t stride = i == 0 ? 1 : 2;
    stages_.push_back(
        register_module("layer" + std::to_string(i + 1),
                        std::make_shared<Stage>(host, config.bottleneck, channels, config.planes[i],
                                                config.blocks[i], stride)));
  }
  fc_ = register_module("fc", std::make_shared<Linear>(channels, config.num_classes));
}

at::Tensor ResNet::forward(const at::Tensor& input) {
  at::Tensor x = stem_->forward(input);
  for (const auto& stage : stages_) x = stage->forward(x);
  // Global average pool: [N, C, H, W] → [N, C].
  return fc_->forward(x.mean({2, 3}));
}

std::vector<std::string> ResNet::block_names() const {
  std::vector<std::string> names{"stem"};
  for (size_t i = 0; i < stages_.size(); ++i) names.push_back("layer" + std::to_string(i + 1));
  return names;
}

}  // namespace kiln_resnet
