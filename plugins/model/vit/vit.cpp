#include "vit.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/empty.h>

namespace kiln_vit {

Vit::Vit(const VitConfig& config) : dropout_(config.dropout) {
  patch_embed_ = register_module(
      "patch_embed", std::make_shared<PatchEmbed>(config.in_channels, config.dim, config.patch));
  const int64_t tokens =
      (config.height / config.patch) * (config.width / config.patch) + (config.cls_pool ? 1 : 0);
  // timm: trunc_normal_(std=.02) with absolute bounds ±2 (see Linear).
  if (config.cls_pool) {
    at::Tensor cls = at::empty({1, 1, config.dim});
    trunc_normal_(cls, 0.02, -2.0, 2.0);
    cls_token_ = register_parameter("cls_token", cls);
  }
  at::Tensor pos = at::empty({1, tokens, config.dim});
  trunc_normal_(pos, 0.02, -2.0, 2.0);
  pos_embed_ = register_parameter("pos_embed", pos);
  blocks_ = register_module("blocks", std::make_shared<kiln::BlockChain>());
  for (int64_t i = 0; i < config.depth; ++i) {
    blocks_->add(std::make_shared<Block>(config.dim, config.heads, config.hidden, config.dropout));
  }
  norm_ = register_module("norm", std::make_shared<LayerNorm>(config.dim));
  head_ = register_module("head", std::make_shared<Linear>(config.dim, config.num_classes));
}

at::Tensor Vit::forward(const at::Tensor& input) {
  at::Tensor x = patch_embed_->forward(input);
  if (cls_token_.defined()) x = at::cat({cls_token_.expand({x.size(0), -1, -1}), x}, 1);
  x = x + pos_embed_;
  if (dropout_ > 0.0) x = at::dropout(x, dropout_, is_training());
  x = norm_->forward(blocks_->forward(x));
  return head_->forward(cls_token_.defined() ? x.select(1, 0) : x.mean(1));
}

}  // namespace kiln_vit
