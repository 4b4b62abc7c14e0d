// The transformer encoder block (pre-norm, timm's Block) and its two halves. Child names follow
// timm: norm1, attn.{qkv,proj}, norm2, mlp.{fc1,fc2}.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

#include "layers.hpp"

namespace kiln_vit {

// Multi-head self-attention: qkv projection → heads → scaled dot-product attention → proj.
class Attention : public torch::nn::Module {
 public:
  Attention(int64_t dim, int64_t heads, double dropout);
  at::Tensor forward(const at::Tensor& input);  // [N, T, dim] → [N, T, dim]

 private:
  std::shared_ptr<Linear> qkv_;
  std::shared_ptr<Linear> proj_;
  int64_t heads_;
  double dropout_;  // after proj (timm's proj_drop)
};

// fc1 → GELU (exact, erf) → dropout → fc2 → dropout (timm's Mlp).
class Mlp : public torch::nn::Module {
 public:
  Mlp(int64_t dim, int64_t hidden, double dropout);
  at::Tensor forward(const at::Tensor& input);

 private:
  std::shared_ptr<Linear> fc1_;
  std::shared_ptr<Linear> fc2_;
  double dropout_;
};

// x + attn(norm1(x)), then x + mlp(norm2(x)); a block the host may checkpoint.
class Block : public torch::nn::Module {
 public:
  Block(int64_t dim, int64_t heads, int64_t hidden, double dropout);
  at::Tensor forward(const at::Tensor& input);

 private:
  std::shared_ptr<LayerNorm> norm1_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<LayerNorm> norm2_;
  std::shared_ptr<Mlp> mlp_;
};

}  // namespace kiln_vit
