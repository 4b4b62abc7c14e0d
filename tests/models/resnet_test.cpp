// The resnet model plugin through its C ABI.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "model_checks.hpp"
#include "model_plugin.hpp"

namespace kiln_test {
namespace {

const ModelPlugin& resnet() { return ModelPlugin::get("libkiln_resnet.so"); }

std::shared_ptr<kiln::Model> build(OptionSet options, int64_t c, int64_t h, int64_t w,
                                   int64_t classes = 10) {
  Created created = resnet().create(options, c, h, w, classes);
  if (created.status) throw std::runtime_error("create failed: " + created.status->message);
  return created.model;
}

int32_t create_error(OptionSet options) {
  Created created = resnet().create(options, 3, 32, 32, 10);
  EXPECT_EQ(created.model, nullptr);
  return created.status ? created.status->code : KILN_OK;
}

// The checkpointable blocks of a four-stage network with `per_stage` blocks in each stage.
std::vector<std::string> four_stages(const std::vector<int>& per_stage) {
  std::vector<std::string> names;
  for (size_t s = 0; s < per_stage.size(); ++s) {
    for (int b = 0; b < per_stage[s]; ++b) {
      names.push_back("layer" + std::to_string(s + 1) + "." + std::to_string(b));
    }
  }
  return names;
}

TEST(ResNetTest, SmallOutputShapeForBothInputs) {
  for (auto [c, h, w] : {std::tuple<int64_t, int64_t, int64_t>{1, 28, 28}, {3, 32, 32}}) {
    auto model = build(OptionSet(), c, h, w);
    EXPECT_EQ(model->forward(at::randn({2, c, h, w})).sizes(), at::IntArrayRef({2, 10}));
    EXPECT_EQ(model->block_names(), (std::vector<std::string>{"layer1.0", "layer2.0", "layer3.0"}));
  }
}

TEST(ResNetTest, SmallFollowsWidthAndBlocks) {
  auto model = build(OptionSet().set_int("width", 8).set_int_list("blocks", {2, 1}), 1, 28, 28);
  EXPECT_EQ(model->block_names(), (std::vector<std::string>{"layer1.0", "layer1.1", "layer2.0"}));
  EXPECT_EQ(parameter(*model, "conv1.weight").sizes(), at::IntArrayRef({8, 1, 3, 3}));
  EXPECT_EQ(parameter(*model, "layer1.1.conv2.weight").sizes(), at::IntArrayRef({8, 8, 3, 3}));
  EXPECT_EQ(parameter(*model, "layer2.0.conv1.weight").sizes(), at::IntArrayRef({16, 8, 3, 3}));
  EXPECT_EQ(parameter(*model, "layer2.0.downsample.0.weight").sizes(),
            at::IntArrayRef({16, 8, 1, 1}));
  EXPECT_EQ(parameter(*model, "layer2.0.downsample.1.weight").sizes(), at::IntArrayRef({16}));
  EXPECT_EQ(parameter(*model, "fc.weight").sizes(), at::IntArrayRef({10, 16}));
  // Stride 1 and equal widths: the first stage keeps the identity shortcut.
  EXPECT_EQ(parameter_names(*model).count("layer1.0.downsample.0.weight"), 0u);
  EXPECT_EQ(model->forward(at::randn({2, 1, 28, 28})).sizes(), at::IntArrayRef({2, 10}));
}

TEST(ResNetTest, SmallAsksForNormLayersWithTheirActivations) {
  norm_requests().clear();
  build(OptionSet(), 3, 32, 32);
  // stem; layer1.0: bn1, bn2; layer2.0 and layer3.0: bn1, bn2, downsample.1.
  const std::vector<std::pair<int64_t, int32_t>> expected{
      {16, KILN_ACT_RELU}, {16, KILN_ACT_RELU}, {16, KILN_ACT_NONE},
      {32, KILN_ACT_RELU}, {32, KILN_ACT_NONE}, {32, KILN_ACT_NONE},
      {64, KILN_ACT_RELU}, {64, KILN_ACT_NONE}, {64, KILN_ACT_NONE}};
  std::vector<std::pair<int64_t, int32_t>> got;
  for (const kiln_norm_request& r : norm_requests()) got.emplace_back(r.num_features, r.activation);
  EXPECT_EQ(got, expected);
}

TEST(ResNetTest, SmallBackwardReachesEveryParameter) {
  auto model = build(OptionSet().set_int_list("blocks", {2, 1, 1}), 1, 28, 28);
  expect_trains(*model, 4, 1, 28, 28, 10);
}

// The ReLU residual merge runs as one fused add + relu (add_relu.hpp); leaky_relu with slope 0
// is the same function through the generic add, then activation. Same seed, same weights: the
// logits and every gradient agree, in both memory layouts.
TEST(ResNetTest, FusedReluMergeMatchesTheGenericPath) {
  for (const bool channels_last : {false, true}) {
    SCOPED_TRACE(channels_last ? "channels_last" : "contiguous");
    at::manual_seed(0);
    auto fused = build(OptionSet().set_int_list("blocks", {1, 1, 1}), 3, 16, 16);
    at::manual_seed(0);
    auto generic = build(OptionSet()
                             .set_int_list("blocks", {1, 1, 1})
                             .set_string("activation", "leaky_relu")
                             .set_float("activation_param", 0.0),
                         3, 16, 16);
    at::Tensor x = at::randn({4, 3, 16, 16});
    if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    const at::Tensor weights = at::randn({4, 10});
    const at::Tensor a = fused->forward(x), b = generic->forward(x);
    EXPECT_TRUE(at::allclose(a, b, 1e-5, 1e-6));
    (a * weights).sum().backward();
    (b * weights).sum().backward();
    const auto pa = fused->named_parameters(), pb = generic->named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (const auto& item : pa) {
      const at::Tensor& ga = item.value().grad();
      const at::Tensor& gb = pb[item.key()].grad();
      ASSERT_TRUE(ga.defined() && gb.defined()) << item.key();
      EXPECT_TRUE(at::allclose(ga, gb, 1e-4, 1e-6))
          << item.key() << ": max gap " << (ga - gb).abs().max().item<double>();
    }
  }
}

TEST(ResNetTest, InitialisesLikeTorchDefaults) {
  auto model = build(OptionSet(), 3, 32, 32);
  for (auto [name, fan_in] : {std::pair<std::string, int64_t>{"conv1.weight", 3 * 9},
                              {"layer2.0.conv2.weight", 32 * 9},
                              {"fc.weight", 64},
                              {"fc.bias", 64}}) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    const double max = parameter(*model, name).abs().max().item<double>();
    EXPECT_LE(max, bound) << name;
    // The largest of n draws from U(±bound) stays below t·bound with probability t^n: a
    // threshold of bound·1e-9^(1/n) fails a correct initialisation once in a billion runs.
    const double n = static_cast<double>(parameter(*model, name).numel());
    EXPECT_GT(max, bound * std::pow(1e-9, 1.0 / n)) << name;
  }
}

TEST(ResNetTest, Resnet18MatchesTorchvisionAt224) {
  auto model = build(OptionSet().set_string("depth", "18"), 3, 224, 224);
  EXPECT_EQ(parameter_count(*model), 11181642);
  EXPECT_EQ(parameter(*model, "conv1.weight").sizes(), at::IntArrayRef({64, 3, 7, 7}));
  EXPECT_EQ(parameter(*model, "layer4.1.conv2.weight").sizes(), at::IntArrayRef({512, 512, 3, 3}));
  EXPECT_EQ(model->block_names(), four_stages({2, 2, 2, 2}));
}

TEST(ResNetTest, Resnet50MatchesTorchvisionAt224) {
  auto model = build(OptionSet().set_string("depth", "50"), 3, 224, 224);
  EXPECT_EQ(parameter_count(*model), 23528522);
  EXPECT_EQ(parameter(*model, "layer1.0.downsample.0.weight").sizes(),
            at::IntArrayRef({256, 64, 1, 1}));
  EXPECT_EQ(parameter(*model, "layer3.5.conv3.weight").sizes(), at::IntArrayRef({1024, 256, 1, 1}));
  EXPECT_EQ(parameter(*model, "fc.weight").sizes(), at::IntArrayRef({10, 2048}));
  EXPECT_EQ(model->block_names(), four_stages({3, 4, 6, 3}));
}

// torchvision's parameter counts less the 1000-class head's difference (num_classes 10).
TEST(ResNetTest, DeeperResnetsMatchTorchvisionCounts) {
  struct Case {
    const char* depth;
    int64_t parameters;
    std::vector<int> blocks;
  };
  for (const Case& c : {Case{"34", 21797672 - 990 * 513, {3, 4, 6, 3}},
                        Case{"101", 44549160 - 990 * 2049, {3, 4, 23, 3}},
                        Case{"152", 60192808 - 990 * 2049, {3, 8, 36, 3}}}) {
    auto model = build(OptionSet().set_string("depth", c.depth), 3, 64, 64);
    EXPECT_EQ(parameter_count(*model), c.parameters) << c.depth;
    EXPECT_EQ(model->block_names(), four_stages(c.blocks)) << c.depth;
    EXPECT_EQ(parameter(*model, "conv1.weight").sizes(), at::IntArrayRef({64, 3, 7, 7}));
    EXPECT_EQ(parameter(*model, "bn1.weight").sizes(), at::IntArrayRef({64}));
  }
  EXPECT_EQ(create_error(OptionSet().set_string("depth", "101").set_bool("preact", true)),
            KILN_ERR_INVALID_ARGUMENT);
  // preact builds BasicBlocks, so 34 takes it.
  auto preact = build(OptionSet().set_string("depth", "34").set_bool("preact", true), 3, 64, 64);
  EXPECT_EQ(preact->forward(at::randn({1, 3, 64, 64})).sizes(), at::IntArrayRef({1, 10}));
}

TEST(ResNetTest, Resnet18TrainsOnSmallImages) {
  auto model = build(OptionSet().set_string("depth", "18"), 3, 32, 32);
  // Small images get a 3×3 stride-1 stem and no maxpool.
  EXPECT_EQ(parameter(*model, "conv1.weight").sizes(), at::IntArrayRef({64, 3, 3, 3}));
  expect_trains(*model, 2, 3, 32, 32, 10);
}

TEST(ResNetTest, Resnet18ImageNetStemRunsAt64) {
  auto model = build(OptionSet().set_string("depth", "18"), 1, 64, 64, 5);
  EXPECT_EQ(parameter(*model, "conv1.weight").sizes(), at::IntArrayRef({64, 1, 7, 7}));
  EXPECT_EQ(model->forward(at::randn({2, 1, 64, 64})).sizes(), at::IntArrayRef({2, 5}));
}

// `stem` overrides the size rule both ways: torchvision's conv7x7/2 + maxpool on 32-pixel images
// (its weights then load; the logits are checked against torchvision in init_weights_test), the
// conv3x3/1 on 64-pixel ones, and the ImageNet stem on the small network too.
TEST(ResNetTest, StemOverridesTheImageSizeRule) {
  auto imagenet =
      build(OptionSet().set_string("depth", "18").set_string("stem", "imagenet"), 3, 32, 32);
  EXPECT_EQ(parameter(*imagenet, "conv1.weight").sizes(), at::IntArrayRef({64, 3, 7, 7}));
  expect_trains(*imagenet, 2, 3, 32, 32, 10);
  auto cifar = build(OptionSet().set_string("depth", "18").set_string("stem", "cifar"), 3, 64, 64);
  EXPECT_EQ(parameter(*cifar, "conv1.weight").sizes(), at::IntArrayRef({64, 3, 3, 3}));
  EXPECT_EQ(cifar->forward(at::randn({2, 3, 64, 64})).sizes(), at::IntArrayRef({2, 10}));
  auto small = build(OptionSet().set_string("stem", "imagenet"), 1, 28, 28);
  EXPECT_EQ(parameter(*small, "conv1.weight").sizes(), at::IntArrayRef({16, 1, 7, 7}));
  expect_trains(*small, 2, 1, 28, 28, 10);
  // The default, auto, is the size rule (Resnet18TrainsOnSmallImages, ...ImageNetStemRunsAt64).
  auto automatic =
      build(OptionSet().set_string("depth", "18").set_string("stem", "auto"), 3, 32, 32);
  EXPECT_EQ(parameter(*automatic, "conv1.weight").sizes(), at::IntArrayRef({64, 3, 3, 3}));
}

TEST(ResNetTest, Resnet50TrainsOnSmallImages) {
  auto model = build(OptionSet().set_string("depth", "50"), 3, 32, 32);
  expect_trains(*model, 2, 3, 32, 32, 10);
}

TEST(ResNetTest, RejectsInvalidOptions) {
  EXPECT_EQ(create_error(OptionSet().set_int_list("blocks", {})), KILN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(create_error(OptionSet().set_int_list("blocks", {1, 0})), KILN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(create_error(OptionSet().set_int("width", 0)), KILN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(create_error(OptionSet().set_int("width", int64_t{1} << 40)),
            KILN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(create_error(OptionSet().set_string("depth", "35")), KILN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(create_error(OptionSet().set_int("depth", 18)), KILN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(create_error(OptionSet().set_string("stem", "7x7")), KILN_ERR_INVALID_ARGUMENT);
}

TEST(ResNetTest, ReportsNormLayerFailure) {
  fail_norm_layers() = true;
  const int32_t code = create_error(OptionSet());
  fail_norm_layers() = false;
  // The host's own code (the fake host fails with INTERNAL) reaches the caller unchanged.
  EXPECT_EQ(code, KILN_ERR_INTERNAL);
}

}  // namespace
}  // namespace kiln_test

namespace kiln_test {
namespace {

std::vector<std::tuple<int64_t, int32_t, double, int32_t>> requests_of(OptionSet options) {
  norm_requests().clear();
  build(std::move(options), 3, 32, 32);
  std::vector<std::tuple<int64_t, int32_t, double, int32_t>> got;
  for (const kiln_norm_request& r : norm_requests()) {
    got.emplace_back(r.num_features, r.activation, r.activation_param, r.may_overwrite_input);
  }
  return got;
}

TEST(ResNetTest, AsksNormLayersForTheChosenActivation) {
  using R = std::tuple<int64_t, int32_t, double, int32_t>;
  const auto leaky = requests_of(OptionSet().set_string("activation", "leaky_relu"));
  ASSERT_EQ(leaky.size(), 9u);
  // stem and bn1 of each block take the activation (InPlace-ABN's default slope); conv outputs
  // feed nothing else, so every layer may overwrite its input.
  EXPECT_EQ(leaky[0], R(16, KILN_ACT_LEAKY_RELU, 0.01, 1));
  EXPECT_EQ(leaky[2], R(16, KILN_ACT_NONE, 0.0, 1));
  const auto elu =
      requests_of(OptionSet().set_string("activation", "elu").set_float("activation_param", 0.5));
  EXPECT_EQ(elu[3], R(32, KILN_ACT_ELU, 0.5, 1));
}

TEST(ResNetTest, PreActivationBlocksNameAndProtectTheirInputs) {
  using R = std::tuple<int64_t, int32_t, double, int32_t>;
  const auto got = requests_of(OptionSet()
                                   .set_bool("preact", true)
                                   .set_string("activation", "leaky_relu")
                                   .set_int_list("blocks", {2, 1}));
  // layer1.0, layer1.1 (identity shortcuts: bn1 must leave the block input intact), layer2.0
  // (projection: bn1 may overwrite), then the final norm. Every norm is followed by its act.
  const std::vector<R> expected{
      R(16, KILN_ACT_LEAKY_RELU, 0.01, 0), R(16, KILN_ACT_LEAKY_RELU, 0.01, 1),
      R(16, KILN_ACT_LEAKY_RELU, 0.01, 0), R(16, KILN_ACT_LEAKY_RELU, 0.01, 1),
      R(16, KILN_ACT_LEAKY_RELU, 0.01, 1), R(32, KILN_ACT_LEAKY_RELU, 0.01, 1),
      R(32, KILN_ACT_LEAKY_RELU, 0.01, 1)};
  EXPECT_EQ(got, expected);
  auto model =
      build(OptionSet().set_bool("preact", true).set_int_list("blocks", {2, 1}), 1, 28, 28);
  const auto names = parameter_names(*model);
  EXPECT_EQ(names.count("bn1.weight"), 0u);  // the small pre-activation stem is a bare conv
  EXPECT_EQ(names.count("bn.weight"), 1u);
  EXPECT_EQ(parameter(*model, "layer2.0.downsample.0.weight").sizes(),
            at::IntArrayRef({32, 16, 1, 1}));
  EXPECT_EQ(names.count("layer2.0.downsample.1.weight"), 0u);
  expect_trains(*model, 4, 1, 28, 28, 10);
}

TEST(ResNetTest, RefusesUnknownActivationAndPreactBottlenecks) {
  EXPECT_EQ(create_error(OptionSet().set_string("activation", "gelu")), KILN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(create_error(OptionSet().set_string("depth", "50").set_bool("preact", true)),
            KILN_ERR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace kiln_test
