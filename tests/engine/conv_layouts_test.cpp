// Which convolutions of a channels-last model stay NCHW on the CPU (engine/conv_layouts): the
// trace of one forward, the rule, the weights restrided, and Kiln's resnet (plugin_models.hpp)
// running each convolution in its weight's layout, with the same outputs and gradients as in
// NHWC throughout.
#include "engine/conv_layouts.hpp"

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/options.hpp"
#include "config_values.hpp"
#include "engine/memory_format.hpp"
#include "plugin_models.hpp"

namespace {

using kiln::config::OptionSet;
using kiln::config::Value;
using kiln::engine::ConvCall;
namespace engine = kiln::engine;

// A small resnet of width 64 on 8x8 images: stages of 64, 128 and 256 channels at 8x8, 4x4 and
// 2x2 pixels, the last of two blocks. Seeded, so two calls build the same weights.
std::shared_ptr<kiln::Model> resnet() {
  OptionSet o;
  o.set("width", kiln::test::int_value(64));
  Value blocks;
  blocks.type = KILN_OPT_INT_LIST;
  blocks.int_list = {1, 1, 2};
  o.set("blocks", blocks);
  at::manual_seed(3);
  return kiln_test::build_model("resnet", o, 3, 8);
}

at::Tensor images() {
  at::manual_seed(4);
  return engine::in_model_layout(at::randn({4, 3, 8, 8}), true);
}

// The parameter names of the convolutions the trace saw, in call order.
std::vector<std::string> traced_names(kiln::Model& model, const std::vector<ConvCall>& calls) {
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& p : model.named_parameters()) names[p.value().unsafeGetTensorImpl()] = p.key();
  std::vector<std::string> out;
  for (const ConvCall& c : calls) out.push_back(names.count(c.weight) ? names[c.weight] : "?");
  return out;
}

const std::vector<std::string> kSmallMapWeights = {"layer3.0.conv2.weight", "layer3.1.conv1.weight",
                                                   "layer3.1.conv2.weight"};

TEST(ConvLayouts, TheTraceSeesEachConvolutionWithItsWeightAndShapes) {
  auto model = resnet();
  engine::to_channels_last(*model);
  std::map<std::string, at::Tensor> stats_before;
  for (const auto& b : model->named_buffers()) stats_before[b.key()] = b.value().clone();

  const std::vector<ConvCall> calls = engine::trace_convolutions(*model, images());

  const std::vector<std::string> names = traced_names(*model, calls);
  ASSERT_EQ(names.size(), 11U);  // stem, 2 + 3 + 3 + 2 in the blocks (two downsamples)
  EXPECT_EQ(names.front(), "conv1.weight");
  EXPECT_EQ(names.back(), "layer3.1.conv2.weight");
  EXPECT_EQ(calls.front().in_channels, 3);
  EXPECT_EQ(calls.front().out_h, 8);
  EXPECT_EQ(calls.back().in_channels, 256);
  EXPECT_EQ(calls.back().kernel_h, 3);
  EXPECT_EQ(calls.back().out_h * calls.back().out_w, 4);
  for (const ConvCall& c : calls) EXPECT_TRUE(c.input_channels_last);
  // Evaluation mode without gradients: the model is back in training mode, nothing moved.
  EXPECT_TRUE(model->is_training());
  for (const auto& b : model->named_buffers()) {
    EXPECT_TRUE(at::equal(b.value(), stats_before.at(b.key()))) << b.key();
  }
}

TEST(ConvLayouts, TheRulePicksWideKernelsOnSmallMaps) {
  const auto call = [](int64_t channels, int64_t kernel, int64_t h, int64_t w, int64_t groups) {
    ConvCall c;
    c.in_channels = channels;
    c.kernel_h = c.kernel_w = kernel;
    c.out_h = h;
    c.out_w = w;
    c.groups = groups;
    return engine::blocked_nchw_is_faster(c);
  };
  EXPECT_TRUE(call(256, 3, 4, 4, 1));
  EXPECT_TRUE(call(512, 3, 2, 2, 1));
  EXPECT_TRUE(call(2048, 3, 1, 1, 1));
  EXPECT_FALSE(call(255, 3, 4, 4, 1));  // 128 channels: the layouts were level
  EXPECT_FALSE(call(256, 1, 4, 4, 1));  // a 1x1 kernel is faster in NHWC
  EXPECT_FALSE(call(512, 3, 7, 7, 1));  // 49 pixels: within the runs' spread
  EXPECT_FALSE(call(256, 3, 5, 4, 1));
  EXPECT_FALSE(call(256, 3, 4, 4, 256));  // depthwise: not measured
}

TEST(ConvLayouts, TheirWeightsGoNchwAndTheResnetRunsThemThereAlike) {
  auto nhwc = resnet();
  auto mixed = resnet();
  engine::to_channels_last(*nhwc);
  engine::to_channels_last(*mixed);
  const at::Tensor x = images();

  const engine::NchwChoice choice = engine::keep_small_maps_nchw(*mixed, x, true, nullptr);

  EXPECT_TRUE(choice.trace_error.empty()) << choice.trace_error;
  EXPECT_EQ(choice.names, kSmallMapWeights);
  for (const auto& p : mixed->named_parameters()) {
    if (p.value().dim() != 4 || p.value().size(2) == 1) continue;  // 1x1: both layouts at once
    const bool nchw = std::find(kSmallMapWeights.begin(), kSmallMapWeights.end(), p.key()) !=
                      kSmallMapWeights.end();
    EXPECT_EQ(p.value().is_contiguous(), nchw) << p.key();
    EXPECT_EQ(p.value().is_contiguous(at::MemoryFormat::ChannelsLast), !nchw) << p.key();
  }
  // Each convolution ran in its weight's layout: NCHW input exactly for those three.
  const std::vector<ConvCall> calls = engine::trace_convolutions(*mixed, x);
  const std::vector<std::string> names = traced_names(*mixed, calls);
  for (size_t i = 0; i < calls.size(); ++i) {
    const bool nchw = std::find(kSmallMapWeights.begin(), kSmallMapWeights.end(), names[i]) !=
                      kSmallMapWeights.end();
    EXPECT_EQ(calls[i].input_channels_last, !nchw) << names[i];
  }
  // The same training step: oneDNN's kernels sum in another order per layout, so float32
  // rounding apart (relative 1e-4 of the largest value).
  const at::Tensor target = at::arange(4) % 5;
  std::map<std::string, at::Tensor> grads;
  std::vector<at::Tensor> outputs;
  for (auto* m : {nhwc.get(), mixed.get()}) {
    at::Tensor out = m->forward(x);
    at::cross_entropy_loss(out, target).backward();
    outputs.push_back(out.detach());
  }
  const auto close = [](const at::Tensor& a, const at::Tensor& b) {
    return (a - b).abs().max().item<double>() <= 1e-4 * a.abs().max().item<double>() + 1e-7;
  };
  EXPECT_TRUE(close(outputs[0], outputs[1]));
  const auto mixed_params = mixed->named_parameters();
  for (const auto& p : nhwc->named_parameters()) {
    const at::Tensor& g = mixed_params[p.key()].grad();
    ASSERT_TRUE(g.defined()) << p.key();
    EXPECT_TRUE(close(p.value().grad(), g)) << p.key();
  }
}

TEST(ConvLayouts, WithoutAvx512EveryWeightStaysNhwc) {
  auto model = resnet();
  engine::to_channels_last(*model);
  const engine::NchwChoice choice = engine::keep_small_maps_nchw(*model, images(), false, nullptr);
  EXPECT_TRUE(choice.names.empty());
  for (const auto& p : model->named_parameters()) {
    if (p.value().dim() == 4) {
      EXPECT_TRUE(p.value().is_contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
}

// A convolution that passes its input on as it is, as a TorchScript module does.
class PassesItsInputOn : public kiln::Model {
 public:
  PassesItsInputOn() { weight_ = register_parameter("w", at::randn({256, 256, 3, 3})); }
  at::Tensor forward(const at::Tensor& input) override {
    return at::conv2d(input, weight_, {}, 1, 1);
  }

 private:
  at::Tensor weight_;
};

TEST(ConvLayouts, AModelThatRunsItsConvolutionsInNhwcKeepsTheirWeightsNhwc) {
  PassesItsInputOn model;
  engine::to_channels_last(model);
  const at::Tensor x = engine::in_model_layout(at::randn({2, 256, 4, 4}), true);
  ASSERT_TRUE(engine::blocked_nchw_is_faster(engine::trace_convolutions(model, x).at(0)));
  const engine::NchwChoice choice = engine::keep_small_maps_nchw(model, x, true, nullptr);
  EXPECT_TRUE(choice.trace_error.empty()) << choice.trace_error;
  EXPECT_TRUE(choice.names.empty());
  EXPECT_TRUE(model.parameters()[0].is_contiguous(at::MemoryFormat::ChannelsLast));
}

// The strides each weight's gradient came back with equal the weight's own, exactly: what DDP's
// Reducer checks (a warning and a copy per step otherwise).
void expect_gradients_strided_as_weights(kiln::Model& model, const at::Tensor& x) {
  model.zero_grad();
  model.forward(x).sum().backward();
  for (const auto& p : model.named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_EQ(p.value().grad().strides(), p.value().strides()) << p.key();
  }
}

// A 1-channel stem, a 3x3 and a 1x1 convolution, each given its input as it comes.
class ConvChain : public kiln::Model {
 public:
  ConvChain() {
    stem_ = register_parameter("stem", at::randn({8, 1, 3, 3}));
    wide_ = register_parameter("wide", at::randn({16, 8, 3, 3}));
    narrow_ = register_parameter("narrow", at::randn({16, 16, 1, 1}));
  }
  at::Tensor forward(const at::Tensor& input) override {
    at::Tensor x = at::conv2d(input, stem_, {}, 1, 1);
    return at::conv2d(at::conv2d(x, wide_, {}, 1, 1), narrow_);
  }

 private:
  at::Tensor stem_, wide_, narrow_;
};

TEST(ConvLayouts, ChannelsLastGivesEachWeightTheStridesOfItsGradient) {
  ConvChain model;
  const at::Tensor before = model.named_parameters()["narrow"].clone();
  // The 1x1 weight reads as channels-last with its contiguous strides (16, 1, 1, 1), but the
  // gradient of its NHWC convolution comes back with (16, 1, 16, 16). The 1-channel stem's
  // convolution runs in NCHW (its input is both layouts too), so its weight keeps its strides.
  EXPECT_EQ(engine::to_channels_last(model), 2);
  EXPECT_EQ(model.named_parameters()["narrow"].strides(), at::IntArrayRef({16, 1, 16, 16}));
  EXPECT_TRUE(at::equal(model.named_parameters()["narrow"], before));
  EXPECT_EQ(engine::to_channels_last(model), 0);
  expect_gradients_strided_as_weights(model,
                                      engine::in_model_layout(at::randn({2, 1, 8, 8}), true));
}

// A 3x3 convolution on a small map that runs in its weight's layout (as Kiln's resnet does), then
// a 1x1 one that takes its input as it comes (a bottleneck's last convolution).
class WideThenNarrow : public kiln::Model {
 public:
  WideThenNarrow() {
    wide_ = register_parameter("wide", at::randn({256, 256, 3, 3}));
    narrow_ = register_parameter("narrow", at::randn({64, 256, 1, 1}));
  }
  at::Tensor forward(const at::Tensor& input) override {
    const bool nhwc = wide_.is_contiguous(at::MemoryFormat::ChannelsLast);
    at::Tensor x = at::conv2d(nhwc ? input : input.contiguous(), wide_, {}, 1, 1);
    return at::conv2d(x, narrow_);
  }

 private:
  at::Tensor wide_, narrow_;
};

TEST(ConvLayouts, AOneByOneConvolutionAfterAnNchwOneStaysNchwWithIt) {
  WideThenNarrow model;
  engine::to_channels_last(model);
  const at::Tensor x = engine::in_model_layout(at::randn({2, 256, 4, 4}), true);
  const engine::NchwChoice choice = engine::keep_small_maps_nchw(model, x, true, nullptr);
  EXPECT_TRUE(choice.trace_error.empty()) << choice.trace_error;
  EXPECT_EQ(choice.names, (std::vector<std::string>{"wide", "narrow"}));
  // Contiguous strides exactly, so ATen runs the 1x1 convolution in its NCHW input's layout
  // rather than reordering that input to its weight's.
  EXPECT_EQ(model.named_parameters()["narrow"].strides(), at::IntArrayRef({256, 1, 1, 1}));
  expect_gradients_strided_as_weights(model, x);
}

// A forward that throws is reported, and leaves every weight channels-last.
class Failing : public kiln::Model {
 public:
  Failing() { weight_ = register_parameter("w", at::randn({4, 256, 3, 3})); }
  at::Tensor forward(const at::Tensor& /*input*/) override {
    throw std::runtime_error("no forward here");
  }

 private:
  at::Tensor weight_;
};

TEST(ConvLayouts, AForwardThatFailsIsReportedAndChangesNothing) {
  Failing model;
  engine::to_channels_last(model);
  const engine::NchwChoice choice = engine::keep_small_maps_nchw(model, images(), true, nullptr);
  EXPECT_EQ(choice.trace_error, "no forward here");
  EXPECT_TRUE(choice.names.empty());
  EXPECT_TRUE(model.parameters()[0].is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(model.is_training());
}

}  // namespace
