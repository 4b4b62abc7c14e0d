// Parameter groups: which parameters the optimizer updates, with which lr and weight-decay scale.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace kiln::engine {

struct ParamGroup {
  std::string name;          // shown by `kiln plan`
  double lr_scale = 1.0;     // group lr = schedule lr × lr_scale
  double decay_scale = 1.0;  // group weight decay = base × decay_scale
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
};

// Groups every trainable parameter of `model` (frozen ones, requires_grad false, are left out).
std::vector<ParamGroup> build_param_groups(const torch::nn::Module& model);

}  // namespace kiln::engine
