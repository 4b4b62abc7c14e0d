// The attention's q, k and v heads as views of the qkv projection, with a backward that writes
// their three gradients straight into one buffer in the projection's layout.
//
// Why: indexing qkv[0], qkv[1], qkv[2] (timm's older code) back-propagates each through a
// zero-filled tensor of the projection's full size, then sums the three; unbind (timm's newer
// code) stacks them and then copies the stack into the projection's layout. Here each gradient
// is copied once into its slot. Same values as either (only copies, no arithmetic). On the
// bench's ViT (batch 128, 50 tokens, dim 128, 2 CPU threads) a block's way back took 3.1 ms here
// against unbind's 5.0 and indexing's 12.4 (docs/benchmarks.md, "The ViT's attention heads").
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

namespace kiln_vit {

// [N, T, 3·heads·head_dim] → q, k, v, each an [N, heads, T, head_dim] view of `qkv`.
// Differentiable in `qkv`; the views must not be modified in place.
std::array<at::Tensor, 3> split_heads(const at::Tensor& qkv, int64_t heads);

}  // namespace kiln_vit
