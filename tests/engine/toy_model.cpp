#include "toy_model.hpp"

#include <ATen/ops/dropout.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>

namespace kiln_test {

ToyBlock::ToyBlock(int64_t width, size_t inner, double dropout) : dropout_(dropout) {
  weight_ = register_parameter("weight", at::randn({width, width}) * 0.5);
  bias_ = register_parameter("bias", at::randn({width}) * 0.1);
  if (inner > 0) {
    inner_ = register_module("inner", std::make_shared<kiln::BlockChain>());
    for (size_t i = 0; i < inner; ++i) inner_->add(std::make_shared<ToyBlock>(width));
  }
}

at::Tensor ToyBlock::forward(const at::Tensor& input) {
  at::Tensor x = at::tanh(at::linear(input, weight_, bias_));
  if (dropout_ > 0.0) x = at::dropout(x, dropout_, is_training());
  return inner_ ? inner_->forward(x) : x;
}

ToyModel::ToyModel(int64_t width, const std::vector<std::pair<std::string, size_t>>& chains,
                   double dropout) {
  for (const auto& [name, blocks] : chains) {
    auto chain = register_module(name, std::make_shared<kiln::BlockChain>());
    for (size_t i = 0; i < blocks; ++i) chain->add(std::make_shared<ToyBlock>(width, 0, dropout));
    chains_.push_back(chain);
  }
}

at::Tensor ToyModel::forward(const at::Tensor& input) {
  at::Tensor x = input;
  for (const auto& chain : chains_) x = chain->forward(x);
  return x;
}

NestedModel::NestedModel(int64_t width, size_t blocks, size_t inner) {
  outer = register_module("outer", std::make_shared<kiln::BlockChain>());
  for (size_t i = 0; i < blocks; ++i) {
    outer->add(std::make_shared<ToyBlock>(width, i == 0 ? inner : 0));
  }
}

at::Tensor NestedModel::forward(const at::Tensor& input) { return outer->forward(input); }

}  // namespace kiln_test
