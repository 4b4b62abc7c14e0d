// norm.running_stats_update through the host's norm adapter (PluginNormLayer with a NormWindow,
// driven as the trainer drives it) for batchnorm, inplace_abn and syncbn (one process), against
// PyTorch doing the same by hand (tests/oracle/norm_accumulation.py): the running statistics
// after each window of micro-batches (windows of 3, 3, 2 and 1 micro-batches of uneven sizes)
// agree to 1e-5 in every mode, the outputs and input gradients are those of micro_batch, a
// forward recomputed as activation checkpointing does counts once, and plugins that cannot report
// their batch statistics are refused.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kiln_test_paths.h"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/norm_layer.hpp"
#include "plugin/norm_window.hpp"
#include "tensor_scratch.hpp"

namespace {

using kiln::config::OptionSet;
using kiln::config::Value;
using kiln::plugin::NormWindow;
using kiln::plugin::PluginNormLayer;
using kiln::plugin::RunningStatsUpdate;

constexpr double kMomentum = 0.3;  // large, so that the modes differ clearly
constexpr int64_t kChannels = 3;
const std::vector<int64_t> kWindows = {3, 3, 2, 1};
const std::vector<int64_t> kBatchSizes = {4, 6, 3, 5, 2, 7, 4, 3, 5};  // one per micro-batch

const kiln::plugin::Component& norm(const std::string& name) {
  static kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
  static kiln::plugin::Registry registry = [] {
    kiln::plugin::Registry r;
    for (const char* lib : {"batchnorm", "inplace_abn", "syncbn"}) {
      loader.load_library(std::string(KILN_PLUGIN_DIR) + "/libkiln_" + lib + ".so", r);
    }
    return r;
  }();
  return *registry.find(KILN_COMPONENT_NORM, name);
}

OptionSet options() {
  OptionSet o;
  Value v;
  v.type = KILN_OPT_FLOAT;
  v.float_value = kMomentum;
  o.set("momentum", v);
  v.float_value = 1e-5;
  o.set("eps", v);
  return o;
}

const char* mode_name(RunningStatsUpdate mode) {
  switch (mode) {
    case RunningStatsUpdate::kAdjustedMomentum:
      return "adjusted_momentum";
    case RunningStatsUpdate::kPooledWindow:
      return "pooled_window";
    default:
      return "micro_batch";
  }
}

double closeness(const at::Tensor& a, const at::Tensor& e) {
  return kiln::test::closeness(a.to(at::kDouble), e.to(at::kDouble), 1e-5, 1e-5);
}

struct Case {
  std::string component;
  int32_t activation;
  double param;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.component; }

class RunningStatsUpdateVsTorch : public ::testing::TestWithParam<Case> {};

TEST_P(RunningStatsUpdateVsTorch, EveryModeMatchesTheLoopByHand) {
  const Case& c = GetParam();
  at::manual_seed(5);
  kiln::test::TensorScratch oracle;
  std::vector<at::Tensor> xs, gys;
  std::string shapes;
  for (size_t j = 0; j < kBatchSizes.size(); ++j) {
    const std::vector<int64_t> shape = {kBatchSizes[j], kChannels, 3, 4};
    // Channels at different offsets and scales, and every micro-batch a little shifted, so
    // that pooling the window differs from averaging its micro-batches' statistics.
    xs.push_back(at::randn(shape) * at::tensor({1.0f, 2.0f, 0.5f}).view({1, 3, 1, 1}) +
                 at::tensor({3.0f, -1.0f, 0.0f}).view({1, 3, 1, 1}) + 0.3 * static_cast<double>(j));
    gys.push_back(at::randn(shape));
    oracle.write("x" + std::to_string(j) + ".bin", xs.back());
    shapes += std::string(j ? ", " : "") + "[" + std::to_string(shape[0]) + ", 3, 3, 4]";
  }
  std::string windows;
  for (size_t w = 0; w < kWindows.size(); ++w) {
    windows += (w ? ", " : "") + std::to_string(kWindows[w]);
  }
  oracle.write_text("config.json", "{\"momentum\": " + std::to_string(kMomentum) +
                                       ", \"windows\": [" + windows + "], \"shapes\": [" + shapes +
                                       "]}");
  oracle.run("norm_accumulation.py");
  const at::Tensor w0 = at::rand({kChannels}) + 0.5, b0 = at::randn({kChannels});

  std::map<RunningStatsUpdate, std::vector<at::Tensor>> outputs, input_grads;
  for (RunningStatsUpdate mode :
       {RunningStatsUpdate::kMicroBatch, RunningStatsUpdate::kAdjustedMomentum,
        RunningStatsUpdate::kPooledWindow}) {
    const std::string name = mode_name(mode);
    SCOPED_TRACE(name);
    auto window = std::make_shared<NormWindow>(mode);
    kiln_norm_request request{sizeof(kiln_norm_request), kChannels, c.activation, 0, c.param};
    PluginNormLayer layer(norm(c.component), options(), request, 1, window);
    {
      at::NoGradGuard no_grad;
      layer.named_parameters()["weight"].copy_(w0);
      layer.named_parameters()["bias"].copy_(b0);
    }
    size_t j = 0;
    for (size_t w = 0; w < kWindows.size(); ++w) {
      SCOPED_TRACE("window " + std::to_string(w));
      window->begin(kWindows[w]);
      for (int64_t i = 0; i < kWindows[w]; ++i, ++j) {
        window->enter(i);
        at::Tensor x = xs[j].clone().requires_grad_(true);
        at::Tensor y = layer.forward(x);
        if (i == 1) {
          // Activation checkpointing recomputes a segment's forward in backward, with the
          // buffers put back afterwards: the micro-batch must still count once.
          const at::Tensor rm = layer.running_mean.clone(), rv = layer.running_var.clone();
          layer.forward(xs[j].clone().requires_grad_(true));
          at::NoGradGuard no_grad;
          layer.running_mean.copy_(rm);
          layer.running_var.copy_(rv);
        }
        y.backward(gys[j]);
        outputs[mode].push_back(y.detach());
        input_grads[mode].push_back(x.grad());
      }
      window->finish();
      const std::string suffix = name + "_" + std::to_string(w) + ".bin";
      EXPECT_LE(closeness(layer.running_mean, oracle.read("rm_" + suffix, {kChannels})), 1.0)
          << "running_mean " << layer.running_mean << " vs "
          << oracle.read("rm_" + suffix, {kChannels});
      EXPECT_LE(closeness(layer.running_var, oracle.read("rv_" + suffix, {kChannels})), 1.0)
          << "running_var " << layer.running_var << " vs "
          << oracle.read("rv_" + suffix, {kChannels});
    }
    // The mode moves the running statistics only: training outputs and gradients are
    // micro_batch's, bit for bit.
    for (size_t k = 0; k < xs.size(); ++k) {
      EXPECT_TRUE(at::equal(outputs[mode][k], outputs[RunningStatsUpdate::kMicroBatch][k]))
          << "output of micro-batch " << k;
      EXPECT_TRUE(at::equal(input_grads[mode][k], input_grads[RunningStatsUpdate::kMicroBatch][k]))
          << "input gradient of micro-batch " << k;
    }
  }
  // The comparison can fail: the modes end at different running statistics.
  const std::string last = std::to_string(kWindows.size() - 1) + ".bin";
  EXPECT_GT((oracle.read("rm_micro_batch_" + last, {kChannels}) -
             oracle.read("rm_pooled_window_" + last, {kChannels}))
                .abs()
                .max()
                .item<double>(),
            1e-2);
  EXPECT_GT((oracle.read("rv_adjusted_momentum_" + last, {kChannels}) -
             oracle.read("rv_pooled_window_" + last, {kChannels}))
                .abs()
                .max()
                .item<double>(),
            1e-3);
}

INSTANTIATE_TEST_SUITE_P(Plugins, RunningStatsUpdateVsTorch,
                         ::testing::Values(Case{"batchnorm", KILN_ACT_NONE, 0.0},
                                           Case{"inplace_abn", KILN_ACT_LEAKY_RELU, 0.01},
                                           Case{"syncbn", KILN_ACT_RELU, 0.0}),
                         [](const auto& info) { return info.param.component; });

TEST(RunningStatsUpdate, AdjustedMomentumDecaysAWindowAsOneStep) {
  for (double m : {0.0, 1e-4, 0.1, 0.9, 1.0}) {
    for (int64_t k : {1, 2, 3, 8}) {
      const double adjusted = kiln::plugin::adjusted_momentum(m, k);
      EXPECT_NEAR(std::pow(1.0 - adjusted, static_cast<double>(k)), 1.0 - m, 1e-14)
          << "m " << m << ", k " << k;
    }
  }
  EXPECT_EQ(kiln::plugin::adjusted_momentum(0.1, 1), 0.1);
}

// A window of one micro-batch, and no window at all, leave the update to the plugin: every mode
// is then PyTorch's behaviour.
TEST(RunningStatsUpdate, OutsideAccumulationThePluginUpdates) {
  auto window = std::make_shared<NormWindow>(RunningStatsUpdate::kPooledWindow);
  kiln_norm_request request{sizeof(kiln_norm_request), kChannels, KILN_ACT_NONE, 0, 0.0};
  PluginNormLayer layer(norm("batchnorm"), options(), request, 1, window);
  EXPECT_EQ(layer.reporting_window(), nullptr);  // before the first window
  window->begin(1);
  EXPECT_EQ(layer.reporting_window(), nullptr);
  const at::Tensor x = at::randn({5, kChannels, 2, 2});
  layer.forward(x);
  EXPECT_GT(layer.running_mean.abs().max().item<double>(), 0.0) << "moved at once";
  window->finish();
  window->begin(2);
  EXPECT_EQ(layer.reporting_window(), window.get());
  window->finish();
  EXPECT_EQ(layer.reporting_window(), nullptr);  // after the window
}

// A plugin built for an ABI before 1.5 cannot report its batch statistics: a mode that needs them
// is refused when the layer is made, with the reason; micro_batch still works with it.
TEST(RunningStatsUpdate, RefusesAPluginBuiltBeforeAbi15) {
  const kiln::plugin::Component& real = norm("batchnorm");
  kiln_plugin_descriptor old_plugin = *real.plugin;
  old_plugin.abi_minor = 4;
  kiln::plugin::Component old = real;
  old.plugin = &old_plugin;
  kiln_norm_request request{sizeof(kiln_norm_request), kChannels, KILN_ACT_NONE, 0, 0.0};
  for (RunningStatsUpdate mode :
       {RunningStatsUpdate::kAdjustedMomentum, RunningStatsUpdate::kPooledWindow}) {
    try {
      PluginNormLayer layer(old, options(), request, 1, std::make_shared<NormWindow>(mode));
      FAIL() << "a 1.4 plugin was accepted for " << mode_name(mode);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("norm 'batchnorm' is built for Kiln ABI 1.4 and cannot report its "
                          "batch statistics (ABI 1.5)"),
                std::string::npos)
          << what;
    }
  }
  PluginNormLayer layer(old, options(), request, 1,
                        std::make_shared<NormWindow>(RunningStatsUpdate::kMicroBatch));
  layer.forward(at::randn({4, kChannels}));
}

// batchnorm's vtable with a forward that reads its arguments as a 1.4 plugin would (struct_size
// without batch_stats): it updates nothing and reports nothing, which the host refuses.
const kiln_norm_vtable* g_batchnorm = nullptr;

kiln_status* forward_as_1_4(void* instance, kiln_call_context* ctx,
                            const kiln_norm_forward_args* args) {
  kiln_norm_forward_args old = *args;
  old.struct_size = KILN_NORM_FORWARD_ARGS_V1_4_SIZE;
  return g_batchnorm->forward(instance, ctx, &old);
}

TEST(RunningStatsUpdate, AForwardThatReportsNothingIsRefused) {
  const kiln::plugin::Component& real = norm("batchnorm");
  g_batchnorm = static_cast<const kiln_norm_vtable*>(real.descriptor->vtable);
  kiln_norm_vtable vtable = *g_batchnorm;
  vtable.forward = &forward_as_1_4;
  kiln_component_descriptor descriptor = *real.descriptor;
  descriptor.vtable = &vtable;
  kiln::plugin::Component silent = real;
  silent.descriptor = &descriptor;
  auto window = std::make_shared<NormWindow>(RunningStatsUpdate::kPooledWindow);
  kiln_norm_request request{sizeof(kiln_norm_request), kChannels, KILN_ACT_NONE, 0, 0.0};
  PluginNormLayer layer(silent, options(), request, 1, window);
  window->begin(2);
  window->enter(0);
  try {
    layer.forward(at::randn({4, kChannels}));
    FAIL() << "a forward without its report was accepted";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("norm 'batchnorm' forward: reported no batch statistics"),
              std::string::npos)
        << what;
  }
  EXPECT_TRUE(at::equal(layer.running_mean, at::zeros({kChannels})));
  EXPECT_TRUE(at::equal(layer.running_var, at::ones({kChannels})));
}

}  // namespace
