// The leaf layers of the ViT: linear, layer norm and the patch embedding, with timm's
// initialisation. Each keeps plain parameters and calls ATen ops directly.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

#include "kiln/torch.hpp"

namespace kiln_vit {

// Fills `t` in place from N(0, std²) truncated to [a, b] (torch.nn.init.trunc_normal_).
void trunc_normal_(at::Tensor& t, double std, double a, double b);

// y = x·Wᵀ + b; W ~ trunc_normal(std .02), b = 0 (timm's init_weights_vit_timm).
class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in_features, int64_t out_features);
  at::Tensor forward(const at::Tensor& input);

 private:
  at::Tensor weight_;
  at::Tensor bias_;
};

// LayerNorm over the last dimension (weight 1, bias 0, eps 1e-6 as in timm and torchvision).
// A kiln::NormLayer so the host's parameter groups treat weight and bias as norm parameters.
// The host may keep norm layers in float32 while the rest of the model runs in half precision
// (apex O2): then the input is normalised in the parameters' dtype and returned in its own.
class LayerNorm : public kiln::NormLayer {
 public:
  static constexpr double kEps = 1e-6;
  explicit LayerNorm(int64_t features);
  at::Tensor forward(const at::Tensor& input) override;

 private:
  int64_t features_;
  at::Tensor weight_;
  at::Tensor bias_;
};

// The patch convolution: k = stride = patch, with bias; torch.nn.Conv2d's default init
// (kaiming_uniform_(a=√5) weight, U(±1/√fan_in) bias), which timm leaves in place.
class PatchConv : public torch::nn::Module {
 public:
  PatchConv(int64_t in_channels, int64_t dim, int64_t patch);
  at::Tensor forward(const at::Tensor& input);

 private:
  at::Tensor weight_;
  at::Tensor bias_;
  int64_t patch_;
};

// [N, C, H, W] → [N, (H/p)·(W/p), dim] tokens, row-major over the patch grid. Child "proj" so
// the names read patch_embed.proj.{weight,bias}.
class PatchEmbed : public torch::nn::Module {
 public:
  PatchEmbed(int64_t in_channels, int64_t dim, int64_t patch);
  at::Tensor forward(const at::Tensor& input);

 private:
  std::shared_ptr<PatchConv> proj_;
};

}  // namespace kiln_vit
