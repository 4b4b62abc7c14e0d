// The batchnorm plugin's fused CPU kernels (plugins/norm/common/fused_cpu.*) through the host's
// norm layer, against PyTorch's batch norm + activation (ATen's at::batch_norm, relu and
// leaky_relu, the implementation under torch.nn) on the same inputs: output, input/weight/bias
// gradients and running statistics over training steps, then evaluation. Layouts NCHW,
// channels-last (2-D and 3-D), N x C and N x C x L; channel counts on and off the kernels'
// 16-lane blocks. Tolerance: 1e-5 of the reference's largest value, and no further from a
// float64 evaluation than 4x ATen's own float32 distance from it (+1e-6). With `fused = false`
// the layer is ATen's, bit for bit.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kiln_test_paths.h"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/norm_layer.hpp"

namespace {

using kiln::config::OptionSet;
using kiln::config::Value;

const kiln::plugin::Component& norm(const std::string& name) {
  static kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
  static kiln::plugin::Registry registry = [] {
    kiln::plugin::Registry r;
    for (const char* lib : {"batchnorm", "syncbn"}) {
      loader.load_library(std::string(KILN_PLUGIN_DIR) + "/libkiln_" + lib + ".so", r);
    }
    return r;
  }();
  return *registry.find(KILN_COMPONENT_NORM, name);
}

const kiln::plugin::Component& batchnorm() { return norm("batchnorm"); }

OptionSet options(bool fused, bool affine = true) {
  OptionSet o;
  Value v;
  v.type = KILN_OPT_FLOAT;
  v.float_value = 0.1;
  o.set("momentum", v);
  v.float_value = 1e-5;
  o.set("eps", v);
  Value b;
  b.type = KILN_OPT_BOOL;
  b.bool_value = affine;
  o.set("affine", b);
  b.bool_value = true;
  o.set("track_running_stats", b);
  b.bool_value = fused;
  o.set("fused", b);
  return o;
}

enum class Format { kContiguous, kChannelsLast };

at::Tensor in_format(const at::Tensor& t, Format f) {
  if (f == Format::kContiguous) return t.contiguous();
  return t.contiguous(t.dim() == 5 ? at::MemoryFormat::ChannelsLast3d
                                   : at::MemoryFormat::ChannelsLast);
}

at::Tensor activate(const at::Tensor& y, int32_t act, double param) {
  if (act == KILN_ACT_RELU) return at::relu(y);
  if (act == KILN_ACT_LEAKY_RELU) return at::leaky_relu(y, param);
  return y;
}

double largest(const at::Tensor& t) { return t.abs().max().item<double>(); }

// |got - ref| <= 1e-5 max|ref| beyond ATen's own distance from float64 (ATen's channels-last
// backward sums dz·x − mean·Σdz, which cancels for inputs far from zero: 3e-3 off on the offset
// cases), and got is no further from the float64 value than 4x ATen's float32 result is
// (+1e-6 max|ref|).
void expect_close(const at::Tensor& got, const at::Tensor& ref, const at::Tensor& exact,
                  const std::string& what) {
  ASSERT_EQ(got.sizes(), ref.sizes()) << what;
  const double scale = std::max(1.0, largest(ref));
  const double ours = largest(got.to(at::kDouble) - exact);
  const double aten = largest(ref.to(at::kDouble) - exact);
  EXPECT_LE(largest(got - ref), 1e-5 * scale + aten) << what;
  EXPECT_LE(ours, 4 * aten + 1e-6 * scale)
      << what << ": " << ours << " from float64, ATen " << aten;
}

struct Case {
  std::vector<int64_t> shape;
  Format format;
  int32_t activation;
  double param;
  double offset;  // added to the inputs: a mean far from zero against a spread of 3
};

std::string name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s;
  for (int64_t d : c.shape) s += std::to_string(d) + "x";
  s.pop_back();
  s += c.format == Format::kChannelsLast ? "_cl" : "_nc";
  s += c.activation == KILN_ACT_RELU         ? "_relu"
       : c.activation == KILN_ACT_LEAKY_RELU ? "_leaky"
                                             : "_none";
  if (c.offset != 0) s += "_offset";
  return s;
}

// One layer and its reference: at::batch_norm with float32 and float64 parameters and buffers.
class FusedBatchNorm : public ::testing::TestWithParam<Case> {};

TEST_P(FusedBatchNorm, MatchesTorchInTrainingAndEvaluation) {
  const Case& c = GetParam();
  at::manual_seed(11);
  const int64_t channels = c.shape[1];
  kiln_norm_request request{sizeof(kiln_norm_request), channels, c.activation, 0, c.param};
  kiln::plugin::PluginNormLayer layer(batchnorm(), options(true), request);
  // The layer applies the model's activation itself (there is one to apply, on the CPU).
  EXPECT_EQ(layer.layout().fused_activation, c.activation != KILN_ACT_NONE ? 1 : 0);

  at::Tensor w = at::rand({channels}) + 0.5, b = at::randn({channels});
  auto params = layer.named_parameters();
  {
    at::NoGradGuard no_grad;
    params["weight"].copy_(w);
    params["bias"].copy_(b);
  }
  at::Tensor w_ref = w.clone().requires_grad_(), b_ref = b.clone().requires_grad_();
  at::Tensor w64 = w.to(at::kDouble).requires_grad_(), b64 = b.to(at::kDouble).requires_grad_();
  at::Tensor rm = at::zeros({channels}), rv = at::ones({channels});
  at::Tensor rm64 = rm.to(at::kDouble), rv64 = rv.to(at::kDouble);

  auto step = [&](bool training, const std::string& tag) {
    at::Tensor x = in_format(at::randn(c.shape) * 3 + c.offset, c.format);
    at::Tensor g = in_format(at::randn(c.shape), c.format);
    at::Tensor x_k = x.clone().requires_grad_(), x_ref = x.clone().requires_grad_();
    at::Tensor x64 = x.to(at::kDouble).requires_grad_();
    at::Tensor y_k = layer.forward(x_k);
    at::Tensor y_ref =
        activate(at::batch_norm(x_ref, w_ref, b_ref, rm, rv, training, 0.1, 1e-5, false),
                 c.activation, c.param);
    at::Tensor y64 = activate(at::batch_norm(x64, w64, b64, rm64, rv64, training, 0.1, 1e-5, false),
                              c.activation, c.param);
    EXPECT_TRUE(y_k.is_contiguous(x.suggest_memory_format())) << tag;
    expect_close(y_k, y_ref, y64.detach(), tag + " output");
    (y_k * g).sum().backward();
    (y_ref * g).sum().backward();
    (y64 * g.to(at::kDouble)).sum().backward();
    expect_close(x_k.grad(), x_ref.grad(), x64.grad(), tag + " grad input");
    expect_close(params["weight"].grad(), w_ref.grad(), w64.grad(), tag + " grad weight");
    expect_close(params["bias"].grad(), b_ref.grad(), b64.grad(), tag + " grad bias");
    expect_close(layer.running_mean, rm, rm64, tag + " running mean");
    expect_close(layer.running_var, rv, rv64, tag + " running var");
    for (at::Tensor* t : {&params["weight"], &params["bias"], &w_ref, &b_ref, &w64, &b64}) {
      t->mutable_grad() = at::Tensor();
    }
  };
  for (int k = 0; k < 3; ++k) step(true, "train step " + std::to_string(k));
  layer.eval();  // running statistics, still differentiable (a frozen-statistics fine-tune)
  step(false, "eval");
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, FusedBatchNorm,
    ::testing::Values(Case{{16, 16, 9, 9}, Format::kContiguous, KILN_ACT_RELU, 0.0, 0.0},
                      Case{{16, 16, 9, 9}, Format::kChannelsLast, KILN_ACT_RELU, 0.0, 0.0},
                      Case{{8, 21, 5, 7}, Format::kContiguous, KILN_ACT_LEAKY_RELU, 0.1, 0.0},
                      Case{{8, 21, 5, 7}, Format::kChannelsLast, KILN_ACT_LEAKY_RELU, 0.1, 0.0},
                      Case{{8, 40, 6, 6}, Format::kChannelsLast, KILN_ACT_NONE, 0.0, 0.0},
                      Case{{64, 37}, Format::kContiguous, KILN_ACT_RELU, 0.0, 0.0},
                      Case{{4, 3, 50}, Format::kContiguous, KILN_ACT_NONE, 0.0, 0.0},
                      Case{{2, 18, 3, 4, 5}, Format::kContiguous, KILN_ACT_RELU, 0.0, 0.0},
                      Case{{2, 18, 3, 4, 5}, Format::kChannelsLast, KILN_ACT_RELU, 0.0, 0.0},
                      Case{{32, 16, 12, 12}, Format::kContiguous, KILN_ACT_RELU, 0.0, 100.0},
                      Case{{32, 16, 12, 12}, Format::kChannelsLast, KILN_ACT_RELU, 0.0, 100.0},
                      Case{{128, 64, 7, 7}, Format::kChannelsLast, KILN_ACT_RELU, 0.0, 0.0},
                      Case{{128, 16, 28, 28}, Format::kContiguous, KILN_ACT_RELU, 0.0, 0.0}),
    name);

// The same results on one thread and on several (the channels-last sums are per thread).
TEST(FusedBatchNorm, ThreadCountDoesNotChangeTheResultBeyondRounding) {
  const int threads = at::get_num_threads();
  at::manual_seed(5);
  at::Tensor x = at::randn({64, 24, 10, 10}).contiguous(at::MemoryFormat::ChannelsLast);
  kiln_norm_request request{sizeof(kiln_norm_request), 24, KILN_ACT_RELU, 0, 0.0};
  std::vector<at::Tensor> out;
  for (int n : {1, 2, 4}) {
    at::set_num_threads(n);
    kiln::plugin::PluginNormLayer layer(batchnorm(), options(true), request);
    at::Tensor xk = x.clone().requires_grad_();
    at::Tensor y = layer.forward(xk);
    y.sum().backward();
    out.push_back(at::cat({y.flatten(), xk.grad().flatten(), layer.running_var}));
  }
  at::set_num_threads(threads);
  EXPECT_LE(largest(out[1] - out[0]), 1e-5);
  EXPECT_LE(largest(out[2] - out[0]), 1e-5);
}

// A layer built for a CUDA run leaves the activation to the host where cuDNN's fused batch norm +
// ReLU could never take it (no affine parameters here; ATen's kernels and cuDNN's plain ones take
// the batch norm there); given CPU tensors anyway, it still computes the same as torch. An affine
// one applies the ReLU itself: norm_layer_test's ACudaReluLayerOffCudnnsFusedRouteMatchesTorch.
TEST(FusedBatchNorm, ALayerForACudaRunLeavesTheActivationToTheHost) {
  at::manual_seed(4);
  kiln_norm_request request{sizeof(kiln_norm_request), 5, KILN_ACT_RELU, 0, 0.0};
  kiln::plugin::PluginNormLayer layer(batchnorm(), options(true, false), request, 1, nullptr,
                                      nullptr, c10::kCUDA);
  EXPECT_EQ(layer.layout().fused_activation, 0);
  at::Tensor rm = at::zeros({5}), rv = at::ones({5});
  at::Tensor x = at::randn({8, 5, 3, 3});
  at::Tensor xk = x.clone().requires_grad_(), xr = x.clone().requires_grad_();
  at::Tensor yk = layer.forward(xk);
  at::Tensor yr = at::relu(at::batch_norm(xr, {}, {}, rm, rv, true, 0.1, 1e-5, false));
  EXPECT_LE(largest(yk - yr), 1e-5 * std::max(1.0, largest(yr)));
  yk.sum().backward();
  yr.sum().backward();
  EXPECT_LE(largest(xk.grad() - xr.grad()), 1e-5 * std::max(1.0, largest(xr.grad())));
}

// syncbn shares the kernels: in one process its statistics are the batch's, and with a ReLU
// (applied by the layer on the CPU) it equals torch's batch norm + ReLU, in both layouts.
TEST(FusedBatchNorm, SyncBnInOneProcessSharesTheKernels) {
  for (Format f : {Format::kContiguous, Format::kChannelsLast}) {
    at::manual_seed(6);
    kiln_norm_request request{sizeof(kiln_norm_request), 20, KILN_ACT_RELU, 0, 0.0};
    OptionSet o;
    kiln::plugin::PluginNormLayer layer(norm("syncbn"), o, request);
    EXPECT_EQ(layer.layout().fused_activation, 1);
    at::Tensor w = at::rand({20}) + 0.5, b = at::randn({20});
    auto params = layer.named_parameters();
    {
      at::NoGradGuard no_grad;
      params["weight"].copy_(w);
      params["bias"].copy_(b);
    }
    at::Tensor wr = w.clone().requires_grad_(), br = b.clone().requires_grad_();
    at::Tensor rm = at::zeros({20}), rv = at::ones({20});
    at::Tensor x = in_format(at::randn({12, 20, 6, 6}) * 2 + 3, f);
    at::Tensor g = in_format(at::randn({12, 20, 6, 6}), f);
    at::Tensor xk = x.clone().requires_grad_(), xr = x.clone().requires_grad_();
    at::Tensor yk = layer.forward(xk);
    at::Tensor yr = at::relu(at::batch_norm(xr, wr, br, rm, rv, true, 0.1, 1e-5, false));
    EXPECT_LE(largest(yk - yr), 1e-5 * std::max(1.0, largest(yr)));
    (yk * g).sum().backward();
    (yr * g).sum().backward();
    EXPECT_LE(largest(xk.grad() - xr.grad()), 1e-5 * std::max(1.0, largest(xr.grad())));
    EXPECT_LE(largest(params["weight"].grad() - wr.grad()),
              1e-5 * std::max(1.0, largest(wr.grad())));
    EXPECT_LE(largest(params["bias"].grad() - br.grad()), 1e-5 * std::max(1.0, largest(br.grad())));
    EXPECT_LE(largest(layer.running_var - rv), 1e-5 * std::max(1.0, largest(rv)));
  }
}

// fused = false: ATen's batch norm and the host's activation, bit for bit torch's.
TEST(FusedBatchNorm, FusedFalseIsAtenBitForBit) {
  at::manual_seed(3);
  kiln_norm_request request{sizeof(kiln_norm_request), 6, KILN_ACT_RELU, 0, 0.0};
  kiln::plugin::PluginNormLayer layer(batchnorm(), options(false, false), request);
  EXPECT_EQ(layer.layout().fused_activation, 0);
  at::Tensor rm = at::zeros({6}), rv = at::ones({6});
  at::Tensor x = at::randn({8, 6, 5, 5});
  at::Tensor xk = x.clone().requires_grad_(), xr = x.clone().requires_grad_();
  at::Tensor yk = layer.forward(xk);
  at::Tensor yr = at::relu(at::batch_norm(xr, {}, {}, rm, rv, true, 0.1, 1e-5, false));
  EXPECT_TRUE(at::equal(yk, yr));
  yk.sum().backward();
  yr.sum().backward();
  EXPECT_TRUE(at::equal(xk.grad(), xr.grad()));
  EXPECT_TRUE(at::equal(layer.running_var, rv));
}

// Data the kernels do not take goes through ATen with the activation applied by the layer:
// bfloat16 inputs, and a gradient in another layout than the saved input.
TEST(FusedBatchNorm, DataTheKernelsDoNotTakeStillMatchesTorch) {
  at::manual_seed(9);
  kiln_norm_request request{sizeof(kiln_norm_request), 8, KILN_ACT_LEAKY_RELU, 0, 0.2};
  kiln::plugin::PluginNormLayer layer(batchnorm(), options(true), request);
  ASSERT_EQ(layer.layout().fused_activation, 1);
  at::Tensor rm = at::zeros({8}), rv = at::ones({8});
  at::Tensor w = at::ones({8}).requires_grad_(), b = at::zeros({8}).requires_grad_();

  at::Tensor x = at::randn({6, 8, 4, 4}).contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor g = at::randn({6, 8, 4, 4});  // NCHW: the host hands it over as it comes
  at::Tensor xk = x.clone().requires_grad_(), xr = x.clone().requires_grad_();
  at::Tensor yk = layer.forward(xk);
  at::Tensor yr = at::leaky_relu(at::batch_norm(xr, w, b, rm, rv, true, 0.1, 1e-5, false), 0.2);
  EXPECT_LE(largest(yk - yr), 1e-5 * std::max(1.0, largest(yr)));
  (yk * g).sum().backward();
  (yr * g).sum().backward();
  EXPECT_LE(largest(xk.grad() - xr.grad()), 1e-5 * std::max(1.0, largest(xr.grad())));

  at::Tensor xh = at::randn({6, 8, 4, 4}).to(at::kBFloat16);
  at::Tensor xhk = xh.clone().requires_grad_(), xhr = xh.to(at::kFloat).requires_grad_();
  at::Tensor yhk = layer.forward(xhk);
  at::Tensor yhr = at::leaky_relu(at::batch_norm(xhr, w, b, rm, rv, true, 0.1, 1e-5, false), 0.2);
  EXPECT_EQ(yhk.scalar_type(), at::kBFloat16);
  EXPECT_LE(largest(yhk.to(at::kFloat) - yhr), 2e-2 * std::max(1.0, largest(yhr)));
  yhk.to(at::kFloat).sum().backward();
  yhr.sum().backward();
  EXPECT_LE(largest(xhk.grad().to(at::kFloat) - xhr.grad()),
            3e-2 * std::max(1.0, largest(xhr.grad())));
}

}  // namespace
