#include "split_heads.hpp"

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>

namespace kiln_vit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct SplitHeads : public torch::autograd::Function<SplitHeads> {
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& qkv, int64_t heads) {
    const int64_t batch = qkv.size(0), tokens = qkv.size(1);
    const int64_t head_dim = qkv.size(2) / (3 * heads);
    // [N, T, 3, heads, head_dim] → [3, N, heads, T, head_dim], then one view per part.
    return qkv.reshape({batch, tokens, 3, heads, head_dim}).permute({2, 0, 3, 1, 4}).unbind(0);
  }

  // Autograd hands in zeros for a part that got no gradient (materialised grads, the default).
  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) {
    const int64_t batch = grads[0].size(0), heads = grads[0].size(1), tokens = grads[0].size(2);
    const int64_t head_dim = grads[0].size(3);
    at::Tensor grad = at::empty({batch, tokens, 3, heads, head_dim}, grads[0].options());
    for (int64_t part = 0; part < 3; ++part) {
      // The slot is [N, T, heads, head_dim]; the gradient arrives as [N, heads, T, head_dim].
      grad.select(2, part).copy_(grads[static_cast<size_t>(part)].transpose(1, 2));
    }
    return {grad.view({batch, tokens, 3 * heads * head_dim}), at::Tensor()};
  }
};

}  // namespace

std::array<at::Tensor, 3> split_heads(const at::Tensor& qkv, int64_t heads) {
  variable_list parts = SplitHeads::apply(qkv, heads);
  return {parts[0], parts[1], parts[2]};
}

}  // namespace kiln_vit
