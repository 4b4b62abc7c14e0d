#include "block.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/scaled_dot_product_attention.h>

#include "split_heads.hpp"

namespace kiln_vit {
namespace {

at::Tensor maybe_dropout(const at::Tensor& x, double p, bool training) {
  return p > 0.0 ? at::dropout(x, p, training) : x;
}

}  // namespace

Attention::Attention(int64_t dim, int64_t heads, double dropout)
    : heads_(heads), dropout_(dropout) {
  qkv_ = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim));
  proj_ = register_module("proj", std::make_shared<Linear>(dim, dim));
}

at::Tensor Attention::forward(const at::Tensor& input) {
  const int64_t batch = input.size(0), tokens = input.size(1), dim = input.size(2);
  const auto [q, k, v] = split_heads(qkv_->forward(input), heads_);
  at::Tensor x = at::scaled_dot_product_attention(q, k, v);
  x = proj_->forward(x.transpose(1, 2).reshape({batch, tokens, dim}));
  return maybe_dropout(x, dropout_, is_training());
}

Mlp::Mlp(int64_t dim, int64_t hidden, double dropout) : dropout_(dropout) {
  fc1_ = register_module("fc1", std::make_shared<Linear>(dim, hidden));
  fc2_ = register_module("fc2", std::make_shared<Linear>(hidden, dim));
}

at::Tensor Mlp::forward(const at::Tensor& input) {
  at::Tensor x = maybe_dropout(at::gelu(fc1_->forward(input)), dropout_, is_training());
  return maybe_dropout(fc2_->forward(x), dropout_, is_training());
}

Block::Block(int64_t dim, int64_t heads, int64_t hidden, double dropout) {
  norm1_ = register_module("norm1", std::make_shared<LayerNorm>(dim));
  attn_ = register_module("attn", std::make_shared<Attention>(dim, heads, dropout));
  norm2_ = register_module("norm2", std::make_shared<LayerNorm>(dim));
  mlp_ = register_module("mlp", std::make_shared<Mlp>(dim, hidden, dropout));
}

at::Tensor Block::forward(const at::Tensor& input) {
  at::Tensor x = input + attn_->forward(norm1_->forward(input));
  return x + mlp_->forward(norm2_->forward(x));
}

}  // namespace kiln_vit
