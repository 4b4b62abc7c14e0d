// The Vision Transformer: patch_embed → [cls token] + pos_embed → dropout → blocks → norm →
// head on the cls token or the token mean. Parameter names are timm's: patch_embed.proj.*,
// cls_token (pool cls only), pos_embed, blocks.<i>.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,
// mlp.fc2}.*, norm.*, head.*: timm's VisionTransformer(img_size, patch_size, embed_dim, depth,
// num_heads, mlp_ratio) with its defaults, whose state_dict model.init loads as it is
// (tests/engine/init_weights_test.cpp). Pool mean is timm's class_token=False, global_pool='avg'
// with fc_norm=False: the final norm stays "norm" and runs before the pooling (timm's default for
// avg, fc_norm=None, would name it fc_norm and run it after; that variant is not built).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "block.hpp"
#include "kiln/torch.hpp"
#include "layers.hpp"

namespace kiln_vit {

// What to build, resolved from the options and the input (see resolve_config in plugin.cpp).
struct VitConfig {
  int64_t in_channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t num_classes = 0;
  int64_t patch = 4;
  int64_t dim = 128;
  int64_t depth = 6;
  int64_t heads = 4;
  int64_t hidden = 256;  // MLP width, int(dim · mlp_ratio)
  bool cls_pool = true;  // false: mean over the tokens
  double dropout = 0.0;  // in [0, 1)
};

class Vit : public kiln::Model {
 public:
  explicit Vit(const VitConfig& config);
  at::Tensor forward(const at::Tensor& input) override;

 private:
  std::shared_ptr<PatchEmbed> patch_embed_;
  at::Tensor cls_token_;  // undefined with pool mean
  at::Tensor pos_embed_;
  // The encoder blocks as blocks "0", "1", … (names blocks.<i>; block_names() lists them).
  std::shared_ptr<kiln::BlockChain> blocks_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> head_;
  double dropout_;
};

}  // namespace kiln_vit
