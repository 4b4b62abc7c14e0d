// The MLP model: flatten → [linear → (norm+relu | relu) → dropout] per hidden layer → head.
// Parameter names: layers.<i>.linear.{weight,bias}, layers.<i>.norm.* (when norm is on; names
// below it come from the pipeline's norm layer), head.{weight,bias}.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/torch.hpp"

namespace kiln_mlp {

struct MlpConfig {
  int64_t in_features = 0;
  std::vector<int64_t> hidden;  // widths of the hidden layers, in order; may be empty
  double dropout = 0.0;         // probability, in [0, 1)
  bool norm = false;            // pipeline norm (with relu) instead of a plain relu
  int64_t num_classes = 0;
};

// y = x·Wᵀ + b, initialised like torch.nn.Linear.
class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in_features, int64_t out_features);
  at::Tensor forward(const at::Tensor& input);
  // relu(forward(input)), as one autograd node (linear_relu.hpp).
  at::Tensor forward_relu(const at::Tensor& input);

 private:
  at::Tensor weight_;
  at::Tensor bias_;
};

// One hidden layer; a block the host may checkpoint.
class HiddenLayer : public torch::nn::Module {
 public:
  HiddenLayer(const kiln::NormSource& norms, int64_t in_features, int64_t out_features, bool norm,
              double dropout);
  at::Tensor forward(const at::Tensor& input);

 private:
  std::shared_ptr<Linear> linear_;
  std::shared_ptr<kiln::NormLayer> norm_;  // null: plain relu
  double dropout_;
};

class Mlp : public kiln::Model {
 public:
  Mlp(const kiln::NormSource& norms, const MlpConfig& config);
  at::Tensor forward(const at::Tensor& input) override;

 private:
  // The hidden layers as blocks "0", "1", … (names layers.<i>; block_names() lists them).
  std::shared_ptr<kiln::BlockChain> layers_;
  std::shared_ptr<Linear> head_;
};

}  // namespace kiln_mlp
