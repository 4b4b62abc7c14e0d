// kiln::optim::FlatViews (plugins/optimizer/common): a parameter's tensors, flattened for a fused
// kernel in one layout, come back alike as the CUDA fused kernels require, and element i of each
// is the same element of the parameter. The CPU kernels do not check this, so without this test
// a mismatch shows only on a GPU (Adam with channels_last convolution weights, say).
#include <ATen/ops/arange.h>
#include <ATen/ops/empty_like.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/optim_common.hpp"

namespace kiln::optim {
namespace {

// The sizes-and-strides half of ForeachUtils.h's check_fast_path_restrictions, which the CUDA
// _fused_sgd_ / _fused_adam_ kernels TORCH_CHECK: at each list position the tensors have the
// same sizes, the same strides where a size is not 1, and are dense.
bool kernel_accepts(const std::vector<at::Tensor>& at_one_position) {
  const at::Tensor& first = at_one_position.front();
  for (const at::Tensor& t : at_one_position) {
    if (!t.is_non_overlapping_and_dense() || t.sizes() != first.sizes()) return false;
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (t.size(d) != 1 && t.stride(d) != first.stride(d)) return false;
    }
  }
  return true;
}

// A float tensor of `sizes` holding 0, 1, 2, ... in row-major order, in `format`.
at::Tensor numbered(at::IntArrayRef sizes, at::MemoryFormat format) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  at::Tensor rows = at::arange(n, at::kFloat).view(sizes);
  at::Tensor t = at::empty_like(rows, rows.options(), format);
  return t.copy_(rows);
}

struct Case {
  std::string name;
  std::vector<int64_t> sizes;
  at::MemoryFormat param, grad, state;
};

TEST(FlatViews, AParametersTensorsComeBackAlikeInEitherOptimizersLayout) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  const auto rm = at::MemoryFormat::Contiguous;
  const std::vector<Case> cases = {
      {"row-major conv", {16, 8, 3, 3}, rm, rm, rm},
      // Under model.memory_format = channels_last; the host makes state row-major.
      {"channels_last conv, row-major state", {16, 8, 3, 3}, cl, cl, rm},
      {"channels_last conv and state", {16, 8, 3, 3}, cl, cl, cl},
      {"channels_last conv, row-major grad", {16, 8, 3, 3}, cl, rm, rm},
      {"row-major conv, channels_last grad", {16, 8, 3, 3}, rm, cl, rm},
      {"1x1 channels_last conv", {16, 8, 1, 1}, cl, cl, rm},
      {"bias", {16}, rm, rm, rm},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const at::Tensor param = numbered(c.sizes, c.param);
    const at::Tensor grad = numbered(c.sizes, c.grad);
    const at::Tensor state = numbered(c.sizes, c.state);
    // adam: the state's layout; sgd: the parameter's.
    for (const std::vector<int64_t>& layout :
         {FlatViews::layout_for(param, state), param.strides().vec()}) {
      FlatViews flat;
      const std::vector<at::Tensor> views = {flat.flat(param, layout, at::kFloat, true),
                                             flat.flat(grad, layout, at::kFloat, false),
                                             flat.flat(state, layout, at::kFloat, true)};
      EXPECT_TRUE(kernel_accepts(views))
          << "sizes " << views[0].sizes() << ", " << views[1].sizes() << ", " << views[2].sizes();
      // The kernels pair elements by position in memory: the same number at each position.
      EXPECT_TRUE(views[0].reshape(-1).equal(views[1].reshape(-1)));
      EXPECT_TRUE(views[0].reshape(-1).equal(views[2].reshape(-1)));
      // A staged copy's update reaches the parameter.
      views[0].add_(1.0);
      flat.commit();
      EXPECT_TRUE(param.equal(numbered(c.sizes, c.param).add_(1.0)));
      param.sub_(1.0);
    }
  }
}

}  // namespace
}  // namespace kiln::optim
