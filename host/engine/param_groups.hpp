// Parameter groups: which parameters the optimizer updates, with which lr scale and weight decay.
// Rules, in order of precedence: frozen parameters are left out; a [optimizer.custom_keys] rule
// (regular expression on the name; the longest matched text wins, as mmengine's custom keys)
// sets lr_mult and decay_mult; parameters of norm layers get the norm weight decay; biases
// outside norm layers get the bias lr and decay (Pet and mmengine); everything else the defaults.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "config/pipeline.hpp"

namespace kiln::engine {

struct GroupRules {
  double weight_decay = 0.0;
  double bias_lr_mult = 1.0;       // already includes Pet's bias_double_lr (x2)
  double bias_decay_mult = 1.0;    // 0 when Pet's bias_weight_decay is false
  double norm_weight_decay = 0.0;  // absolute weight decay of norm-layer parameters
  std::vector<config::ParamRule> custom;
  std::vector<std::string> freeze;  // regular expressions
  // [[optimizer.partition]]: parameters other optimizers step (optimizer 1, 2, ... in order)
  std::vector<config::OptimizerPartition> partitions;
  std::vector<std::string> optimizer_names;  // [optimizer]'s, then each partition's
};

// The rules a pipeline's [optimizer] section describes.
GroupRules group_rules(const config::Pipeline& pipeline);

struct ParamGroup {
  // "default", "bias", "norm" or custom_keys["<pattern>"]; with partitions, the part another
  // optimizer steps is "<group>/<optimizer>" ("default/muon")
  std::string name;
  double lr_scale = 1.0;      // group lr = schedule lr × lr_scale
  double weight_decay = 0.0;  // absolute
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  size_t optimizer = 0;  // 0: [optimizer]; k: [[optimizer.partition]] k - 1
};

// Groups the parameters of `model`; frozen ones get requires_grad = false and are left out.
// Empty groups are not returned; "default" comes first, then groups in order of first member.
// A parameter a partition selects (the first whose conditions hold) goes to that group's part
// for the partition's optimizer, after the groups of [optimizer]'s.
std::vector<ParamGroup> build_param_groups(torch::nn::Module& model, const GroupRules& rules);

}  // namespace kiln::engine
