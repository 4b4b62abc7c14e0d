// Parameter groups: Pet's bias and norm rules, mmengine-style custom keys (longest match wins),
// frozen parameters, and the resulting lr scales and weight decays.
#include "engine/param_groups.hpp"

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include "kiln_test_paths.h"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/norm_layer.hpp"

namespace {

using kiln::engine::build_param_groups;
using kiln::engine::GroupRules;
using kiln::engine::ParamGroup;

const kiln::plugin::Component& batchnorm() {
  static kiln::plugin::Registry registry = [] {
    kiln::plugin::Registry r;
    kiln::plugin::LibraryLoader(kiln::plugin::host_api())
        .load_library(std::string(KILN_PLUGIN_DIR) + "/libkiln_batchnorm.so", r);
    return r;
  }();
  return *registry.find(KILN_COMPONENT_NORM, "batchnorm");
}

// conv (weight), bn (norm weight/bias), backbone.fc (weight/bias), head (weight/bias).
struct Net : torch::nn::Module {
  Net() {
    register_parameter("conv", at::zeros({4, 3}));
    kiln::config::OptionSet o;
    kiln::config::Value f;
    f.type = KILN_OPT_FLOAT;
    f.float_value = 0.1;
    o.set("momentum", f);
    f.float_value = 1e-5;
    o.set("eps", f);
    kiln::config::Value b;
    b.type = KILN_OPT_BOOL;
    b.bool_value = true;
    o.set("affine", b);
    o.set("track_running_stats", b);
    kiln_norm_request r{sizeof(kiln_norm_request), 4, KILN_ACT_RELU, 0, 0.0};
    register_module("bn", std::make_shared<kiln::plugin::PluginNormLayer>(batchnorm(), o, r));
    auto backbone = register_module("backbone", std::make_shared<torch::nn::Module>());
    auto fc = backbone->register_module("fc", std::make_shared<torch::nn::Module>());
    fc->register_parameter("weight", at::zeros({2, 4}));
    fc->register_parameter("bias", at::zeros({2}));
    auto head = register_module("head", std::make_shared<torch::nn::Module>());
    head->register_parameter("weight", at::zeros({2, 2}));
    head->register_parameter("bias", at::zeros({2}));
  }
};

const ParamGroup* find(const std::vector<ParamGroup>& groups, const std::string& name) {
  for (const auto& g : groups) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

TEST(ParamGroups, DefaultsPutEverythingAtBaseLrAndDecay) {
  Net net;
  GroupRules rules;
  rules.weight_decay = 1e-4;
  rules.norm_weight_decay = 1e-4;
  auto groups = build_param_groups(net, rules);
  ASSERT_EQ(groups.size(), 3u);  // default, norm, bias: same settings, separate for `kiln plan`
  EXPECT_EQ(groups[0].name, "default");
  EXPECT_EQ(groups[0].names,
            (std::vector<std::string>{"conv", "backbone.fc.weight", "head.weight"}));
  EXPECT_EQ(find(groups, "norm")->names, (std::vector<std::string>{"bn.weight", "bn.bias"}));
  EXPECT_EQ(find(groups, "bias")->names,
            (std::vector<std::string>{"backbone.fc.bias", "head.bias"}));
  for (const auto& g : groups) {
    EXPECT_EQ(g.lr_scale, 1.0) << g.name;
    EXPECT_EQ(g.weight_decay, 1e-4) << g.name;
  }
}

TEST(ParamGroups, PetBiasAndNormRules) {
  Net net;
  GroupRules rules;
  rules.weight_decay = 5e-4;
  rules.bias_lr_mult = 2.0;       // BIAS_DOUBLE_LR
  rules.bias_decay_mult = 0.0;    // BIAS_WEIGHT_DECAY = False
  rules.norm_weight_decay = 0.0;  // WEIGHT_DECAY_NORM = 0
  auto groups = build_param_groups(net, rules);
  const ParamGroup* bias = find(groups, "bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->lr_scale, 2.0);
  EXPECT_EQ(bias->weight_decay, 0.0);
  const ParamGroup* norm = find(groups, "norm");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->lr_scale, 1.0);  // norm biases are norm parameters, not "bias"
  EXPECT_EQ(norm->weight_decay, 0.0);
  EXPECT_EQ(groups[0].weight_decay, 5e-4);
}

TEST(ParamGroups, CustomKeysLongestMatchWinsOverBiasAndNormRules) {
  Net net;
  GroupRules rules;
  rules.weight_decay = 1e-2;
  rules.bias_lr_mult = 2.0;
  rules.custom = {
      {"backbone", 0.1, 1.0, {}}, {"backbone\\.fc\\.b", 0.5, 0.0, {}}, {"^bn\\.", 3.0, 2.0, {}}};
  auto groups = build_param_groups(net, rules);
  const ParamGroup* backbone = find(groups, "custom_keys[\"backbone\"]");
  ASSERT_NE(backbone, nullptr);
  EXPECT_EQ(backbone->names, (std::vector<std::string>{"backbone.fc.weight"}));
  EXPECT_DOUBLE_EQ(backbone->lr_scale, 0.1);
  const ParamGroup* fc_bias = find(groups, "custom_keys[\"backbone\\.fc\\.b\"]");
  ASSERT_NE(fc_bias, nullptr);
  EXPECT_EQ(fc_bias->names, (std::vector<std::string>{"backbone.fc.bias"}));
  EXPECT_EQ(fc_bias->weight_decay, 0.0);
  const ParamGroup* bn = find(groups, "custom_keys[\"^bn\\.\"]");
  ASSERT_NE(bn, nullptr);
  EXPECT_EQ(bn->names, (std::vector<std::string>{"bn.weight", "bn.bias"}));
  EXPECT_DOUBLE_EQ(bn->weight_decay, 2e-2);
  EXPECT_EQ(find(groups, "norm"), nullptr);  // empty groups are dropped
  EXPECT_EQ(find(groups, "bias")->names, (std::vector<std::string>{"head.bias"}));
}

TEST(ParamGroups, FrozenParametersAreLeftOut) {
  Net net;
  GroupRules rules;
  rules.freeze = {"^backbone\\."};
  auto groups = build_param_groups(net, rules);
  size_t members = 0;
  for (const auto& g : groups) {
    members += g.params.size();
    for (const auto& n : g.names) EXPECT_EQ(n.rfind("backbone.", 0), std::string::npos) << n;
  }
  EXPECT_EQ(members, 5u);
  EXPECT_FALSE(net.named_parameters()["backbone.fc.weight"].requires_grad());
}

}  // namespace
