// Small models built in the test (no plugin): chains of tanh(linear) blocks under chosen names.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/torch.hpp"

namespace kiln_test {

// x → dropout(tanh(x·Wᵀ + b)), width → width; holds an inner chain when built with `inner` > 0.
class ToyBlock : public torch::nn::Module {
 public:
  explicit ToyBlock(int64_t width, size_t inner = 0, double dropout = 0.0);
  at::Tensor forward(const at::Tensor& input);

 private:
  at::Tensor weight_, bias_;
  std::shared_ptr<kiln::BlockChain> inner_;
  double dropout_;
};

// Chains registered in order under the given names, run one after another.
class ToyModel : public kiln::Model {
 public:
  ToyModel(int64_t width, const std::vector<std::pair<std::string, size_t>>& chains,
           double dropout = 0.0);
  at::Tensor forward(const at::Tensor& input) override;
  std::shared_ptr<kiln::BlockChain> chain(size_t i) const { return chains_.at(i); }

 private:
  std::vector<std::shared_ptr<kiln::BlockChain>> chains_;
};

// One chain "outer" of `blocks` blocks, whose first block holds a chain "inner" of `inner` blocks
// (named outer.0.inner).
class NestedModel : public kiln::Model {
 public:
  NestedModel(int64_t width, size_t blocks, size_t inner);
  at::Tensor forward(const at::Tensor& input) override;
  std::shared_ptr<kiln::BlockChain> outer;
};

}  // namespace kiln_test
