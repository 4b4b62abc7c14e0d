// Residual blocks and stages. Child names follow torchvision (conv1, bn1, …, downsample.0/1) so
// parameter names line up with torchvision's below the stage ("layer1.0.conv1.weight").
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

#include "kiln/torch.hpp"
#include "layers.hpp"

namespace kiln_resnet {

// The activation every conv → norm → activation unit applies (KILN_ACT_* and its parameter);
// the norm layer is asked to apply it, so an InPlace-ABN norm can fuse it.
struct Activation {
  int32_t kind = KILN_ACT_RELU;
  double param = 0.0;  // leaky_relu slope or elu alpha
  // Applies it in place to a fresh tensor no one else holds.
  at::Tensor apply_(at::Tensor& x) const;
};

// What every block of a network shares.
struct BlockSetup {
  kiln::NormSource norms;  // where norm layers come from (the create call's host and context)
  Activation activation;
  // A norm layer; `overwrites` says the model never reads its input afterwards.
  std::shared_ptr<kiln::NormLayer> norm(int64_t features, bool activate, bool overwrites) const;
};

// The projection shortcut: conv1x1 (stride) → norm, registered as "0" and "1". Pre-activation
// blocks project the already normalised input and have no norm ("0" only).
class Downsample : public torch::nn::Module {
 public:
  Downsample(const BlockSetup& setup, int64_t in_channels, int64_t out_channels, int64_t stride,
             bool with_norm);
  at::Tensor forward(const at::Tensor& input);

 private:
  std::shared_ptr<Conv2d> conv_;
  std::shared_ptr<kiln::NormLayer> norm_;  // null for pre-activation blocks
};

class ResidualBlock : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& input) = 0;

 protected:
  // act(residual + shortcut(input)); the shortcut is the identity without a downsample.
  at::Tensor merge(const at::Tensor& residual, const at::Tensor& input) const;
  std::shared_ptr<Downsample> downsample_;
  Activation activation_;
};

// conv3x3 (stride) → norm+act → conv3x3 → norm, plus the shortcut, then act.
class BasicBlock : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(const BlockSetup& setup, int64_t in_channels, int64_t planes, int64_t stride);
  at::Tensor forward(const at::Tensor& input) override;

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_;
  std::shared_ptr<kiln::NormLayer> bn1_, bn2_;
};

// conv1x1 → norm+act → conv3x3 (stride) → norm+act → conv1x1 (×4) → norm, plus the shortcut,
// then act (torchvision's ResNet v1.5: the stride sits on the 3×3 conv).
class Bottleneck : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(const BlockSetup& setup, int64_t in_channels, int64_t planes, int64_t stride);
  at::Tensor forward(const at::Tensor& input) override;

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_, conv3_;
  std::shared_ptr<kiln::NormLayer> bn1_, bn2_, bn3_;
};

// Pre-activation (ResNet v2, He et al. 2016): norm+act → conv3x3 (stride) → norm+act → conv3x3,
// plus the shortcut (identity, or a 1×1 projection of the normalised input). Every norm is
// followed by its activation and a conv, which is where InPlace-ABN saves the most: each unit
// keeps one tensor instead of two.
class PreActBlock : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 1;
  PreActBlock(const BlockSetup& setup, int64_t in_channels, int64_t planes, int64_t stride);
  at::Tensor forward(const at::Tensor& input) override;

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_;
  std::shared_ptr<kiln::NormLayer> bn1_, bn2_;
};

enum class BlockKind { kBasic, kBottleneck, kPreAct };

// A stage ("layerN"): a chain of blocks "0", "1", … that activation checkpointing may segment.
class Stage : public kiln::BlockChain {
 public:
  // Builds `count` blocks of `planes`; the first has `stride`. `in_channels` is updated to the
  // stage's output channels.
  Stage(const BlockSetup& setup, BlockKind kind, int64_t& in_channels, int64_t planes,
        int64_t count, int64_t stride);
};

}  // namespace kiln_resnet
