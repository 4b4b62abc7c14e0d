// The mlp model plugin through its C ABI.
#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_bf16_autocast.hpp"
#include "graph_util.hpp"
#include "model_checks.hpp"
#include "model_plugin.hpp"
#include "tensor_scratch.hpp"

namespace kiln_test {
namespace {

using kiln::test::closeness;
using kiln::test::TensorScratch;

const ModelPlugin& mlp() { return ModelPlugin::get("libkiln_mlp.so"); }

std::shared_ptr<kiln::Model> build(OptionSet options, int64_t c, int64_t h, int64_t w,
                                   int64_t classes = 10) {
  Created created = mlp().create(options, c, h, w, classes);
  if (created.status) throw std::runtime_error("create failed: " + created.status->message);
  return created.model;
}

int32_t create_error(OptionSet options, int64_t classes = 10) {
  Created created = mlp().create(options, 1, 28, 28, classes);
  EXPECT_EQ(created.model, nullptr);
  return created.status ? created.status->code : KILN_OK;
}

TEST(MlpTest, OutputShapeForBothInputs) {
  for (auto [c, h, w] : {std::tuple<int64_t, int64_t, int64_t>{1, 28, 28}, {3, 32, 32}}) {
    auto model = build(OptionSet(), c, h, w);
    at::Tensor logits = model->forward(at::randn({4, c, h, w}));
    EXPECT_EQ(logits.sizes(), at::IntArrayRef({4, 10}));
  }
}

TEST(MlpTest, DefaultsGiveTwoHiddenLayersWithDocumentedNames) {
  auto model = build(OptionSet(), 1, 28, 28);
  EXPECT_EQ(parameter_names(*model),
            (std::set<std::string>{"layers.0.linear.weight", "layers.0.linear.bias",
                                   "layers.1.linear.weight", "layers.1.linear.bias", "head.weight",
                                   "head.bias"}));
  EXPECT_EQ(parameter_count(*model), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ(model->block_names(), (std::vector<std::string>{"layers.0", "layers.1"}));
  EXPECT_EQ(parameter(*model, "layers.0.linear.weight").sizes(), at::IntArrayRef({256, 784}));
}

TEST(MlpTest, ComputesReluLayersThenHead) {
  auto model = build(OptionSet().set_int_list("hidden", {8}), 1, 4, 4, 3);
  at::Tensor x = at::randn({5, 1, 4, 4});
  at::Tensor h =
      at::relu(at::matmul(x.reshape({5, 16}), parameter(*model, "layers.0.linear.weight").t()) +
               parameter(*model, "layers.0.linear.bias"));
  at::Tensor expected =
      at::matmul(h, parameter(*model, "head.weight").t()) + parameter(*model, "head.bias");
  EXPECT_TRUE(at::allclose(model->forward(x), expected, 1e-5, 1e-6));
}

// The hidden layers' linear + relu run as one autograd node (linear_relu.hpp), with a backward
// of the plugin's own; torch.nn.functional's linear and relu (tests/oracle/mlp.py) are the
// oracle for the logits, every parameter's gradient and the images' gradient, and for the
// logits under bf16 autocast (where the plugin falls back to torch's nodes).
TEST(MlpTest, MatchesTorchOracleForwardAndBackward) {
  const std::vector<int64_t> hidden{24, 16, 16};
  const int64_t batch = 6, classes = 5;
  at::manual_seed(3);
  auto model = build(OptionSet().set_int_list("hidden", hidden), 2, 4, 4, classes);
  // Wide draws: each relu sees both signs, and a bias of zero cannot hide a wiring mistake.
  {
    at::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) item.value().normal_(0.0, 0.5);
  }
  TensorScratch oracle;
  std::ostringstream config;
  config << "{\"hidden\": " << hidden.size() << ", \"shape\": [" << batch
         << ", 2, 4, 4], \"params\": " << write_parameters(oracle, *model) << "}";
  oracle.write_text("config.json", config.str());
  at::Tensor images = at::randn({batch, 2, 4, 4}).requires_grad_(true);
  at::Tensor upstream = at::randn({batch, classes});
  oracle.write("images.bin", images);
  oracle.write("upstream.bin", upstream);

  at::Tensor logits = model->forward(images);
  // One fused node per hidden layer, none for the head.
  EXPECT_EQ(nodes_named(logits, "LinearRelu").size(), hidden.size());
  (logits * upstream).sum().backward();
  at::Tensor no_grad_logits, bf16_logits;
  {
    at::NoGradGuard no_grad;
    no_grad_logits = model->forward(images);
    CpuBf16Autocast autocast;
    bf16_logits = model->forward(images);
  }
  oracle.run("mlp.py");

  // fp32: the same ATen kernels (addmm, relu, threshold_backward, mm, sum) on the same values;
  // the margin allows another reduction order in the gemms' blocking.
  at::Tensor want = oracle.read("logits_fp32.bin", {batch, classes});
  EXPECT_LE(closeness(logits, want, 1e-5, 1e-6), 1.0);
  EXPECT_LE(closeness(no_grad_logits, want, 1e-5, 1e-6), 1.0);
  for (const auto& item : model->named_parameters()) {
    const at::Tensor& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << item.key();
    // Written in the parameter's own layout, so AccumulateGrad keeps it without a copy.
    EXPECT_TRUE(grad.is_contiguous()) << item.key();
    EXPECT_LE(
        closeness(grad, oracle.read("grad." + item.key() + ".bin", grad.sizes().vec()), 1e-5, 1e-6),
        1.0)
        << item.key();
  }
  EXPECT_LE(
      closeness(images.grad(), oracle.read("grad.images.bin", images.sizes().vec()), 1e-5, 1e-6),
      1.0);
  // bf16 autocast: the same casts and ops on both sides; one bf16 rounding step of margin.
  ASSERT_EQ(bf16_logits.scalar_type(), at::kBFloat16);
  EXPECT_LE(closeness(bf16_logits, oracle.read("logits_bf16.bin", {batch, classes}), 4e-3, 1e-3),
            1.0);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
}

TEST(MlpTest, InitialisesLikeTorchLinear) {
  at::manual_seed(7);  // a fixed draw: the bounds below are statistical
  auto model = build(OptionSet(), 1, 28, 28);
  // kaiming_uniform_(a=√5) and the bias both draw from U(±1/√fan_in).
  for (auto [name, fan_in] : {std::pair<std::string, int64_t>{"layers.0.linear.weight", 784},
                              {"layers.1.linear.weight", 256},
                              {"layers.1.linear.bias", 256},
                              {"head.weight", 128}}) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    const double max = parameter(*model, name).abs().max().item<double>();
    // float32 draws: the bound itself rounds to float, up to half an ulp above the double.
    EXPECT_LE(max, bound * (1.0 + 1e-7)) << name;
    // The largest of n draws from U(±bound) stays below t·bound with probability t^n: a
    // threshold of bound·1e-9^(1/n) fails a correct initialisation once in a billion runs.
    const double n = static_cast<double>(parameter(*model, name).numel());
    EXPECT_GT(max, bound * std::pow(1e-9, 1.0 / n)) << name;
  }
}

TEST(MlpTest, NormOptionAsksForReluNormLayers) {
  norm_requests().clear();
  auto plain = build(OptionSet().set_int_list("hidden", {32, 16}), 1, 28, 28);
  EXPECT_TRUE(norm_requests().empty());
  auto normed =
      build(OptionSet().set_int_list("hidden", {32, 16}).set_bool("norm_layers", true), 1, 28, 28);
  ASSERT_EQ(norm_requests().size(), 2u);
  EXPECT_EQ(norm_requests()[0].num_features, 32);
  EXPECT_EQ(norm_requests()[1].num_features, 16);
  for (const kiln_norm_request& r : norm_requests()) EXPECT_EQ(r.activation, KILN_ACT_RELU);
  EXPECT_EQ(parameter_names(*normed).count("layers.1.norm.weight"), 1u);
  EXPECT_EQ(parameter_count(*normed), parameter_count(*plain) + 2 * (32 + 16));
}

TEST(MlpTest, BackwardReachesEveryParameter) {
  auto model =
      build(OptionSet().set_bool("norm_layers", true).set_float("dropout", 0.2), 3, 32, 32);
  expect_trains(*model, 4, 3, 32, 32, 10);
}

TEST(MlpTest, DropoutOnlyWhileTraining) {
  auto model = build(OptionSet().set_float("dropout", 0.5), 1, 28, 28);
  at::Tensor x = at::randn({8, 1, 28, 28});
  EXPECT_FALSE(at::equal(model->forward(x), model->forward(x)));
  model->eval();
  EXPECT_TRUE(at::equal(model->forward(x), model->forward(x)));
}

TEST(MlpTest, EmptyHiddenIsALinearClassifier) {
  auto model = build(OptionSet().set_int_list("hidden", {}), 1, 28, 28);
  EXPECT_TRUE(model->block_names().empty());
  EXPECT_EQ(parameter_count(*model), 784 * 10 + 10);
  EXPECT_EQ(model->forward(at::randn({2, 1, 28, 28})).sizes(), at::IntArrayRef({2, 10}));
}

TEST(MlpTest, RejectsInvalidOptions) {
  EXPECT_EQ(create_error(OptionSet().set_float("dropout", 1.0)), KILN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(create_error(OptionSet().set_float("dropout", -0.1)), KILN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(create_error(OptionSet().set_int_list("hidden", {64, 0})), KILN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(create_error(OptionSet().set_int("hidden", 64)), KILN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(create_error(OptionSet(), /*classes=*/0), KILN_ERR_INVALID_ARGUMENT);
}

TEST(MlpTest, ReportsNormLayerFailure) {
  fail_norm_layers() = true;
  const int32_t code = create_error(OptionSet().set_bool("norm_layers", true));
  fail_norm_layers() = false;
  // The host's own code (the fake host fails with INTERNAL) reaches the caller unchanged.
  EXPECT_EQ(code, KILN_ERR_INTERNAL);
}

}  // namespace
}  // namespace kiln_test
