// The norm adapter (plugin forward/backward behind a custom autograd function) with the batchnorm
// plugin equals PyTorch's own batch norm (ATen's, the implementation under torch.nn.BatchNorm2d)
// in output, input/weight/bias gradients and running statistics, to 1e-5.
#include "plugin/norm_layer.hpp"

#include <ATen/DLConvertor.h>
#include <ATen/Functions.h>
#include <ATen/native/Normalization.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config/pipeline.hpp"
#include "engine/model_build.hpp"
#include "kiln/torch.hpp"
#include "kiln_test_paths.h"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/status.hpp"

namespace {

using kiln::config::OptionSet;
using kiln::config::Value;

// A built-in norm component by name (the libraries loaded once).
const kiln::plugin::Component& norm(const std::string& name) {
  static kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
  static kiln::plugin::Registry registry = [] {
    kiln::plugin::Registry r;
    for (const char* lib : {"batchnorm", "inplace_abn", "frozen_bn"}) {
      loader.load_library(std::string(KILN_PLUGIN_DIR) + "/libkiln_" + lib + ".so", r);
    }
    return r;
  }();
  return *registry.find(KILN_COMPONENT_NORM, name);
}

const kiln::plugin::Component& batchnorm() { return norm("batchnorm"); }

OptionSet options(double momentum, double eps) {
  OptionSet o;
  Value v;
  v.type = KILN_OPT_FLOAT;
  v.float_value = momentum;
  o.set("momentum", v);
  v.float_value = eps;
  o.set("eps", v);
  Value b;
  b.type = KILN_OPT_BOOL;
  b.bool_value = true;
  o.set("affine", b);
  o.set("track_running_stats", b);
  return o;
}

// `o` with the bool option `key` set to false.
OptionSet without(OptionSet o, const char* key) {
  Value no;
  no.type = KILN_OPT_BOOL;
  no.bool_value = false;
  o.set(key, no);
  return o;
}

void expect_close(const at::Tensor& a, const at::Tensor& b, double tol, const char* what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  double diff = (a - b).abs().max().item<double>();
  double scale = std::max(1.0, b.abs().max().item<double>());
  EXPECT_LE(diff, tol * scale) << what;
}

struct Case {
  std::vector<int64_t> shape;
  int32_t activation;
  double param;
};

// ATen's batch norm beside a layer: its own weight, bias and running statistics (momentum 0.1,
// eps 1e-5), the layer's parameters set to the same initial values.
struct TorchTwin {
  TorchTwin(kiln::plugin::PluginNormLayer& layer, int64_t channels,
            const at::TensorOptions& options = at::TensorOptions())
      : w((at::rand({channels}, options) + 0.5).requires_grad_()),
        b(at::randn({channels}, options).requires_grad_()),
        rm(at::zeros({channels}, options)),
        rv(at::ones({channels}, options)),
        layer(layer),
        params(layer.named_parameters()) {
    at::NoGradGuard no_grad;
    params["weight"].copy_(w);
    params["bias"].copy_(b);
  }

  at::Tensor forward(const at::Tensor& x, bool training, bool cudnn = false) {
    return at::batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5, cudnn);
  }

  // The layer's parameter gradients and running statistics against the twin's (on the CPU), then
  // both sides' gradients cleared for the next step.
  void expect_same_state(double tol) {
    expect_close(params["weight"].grad().cpu(), w.grad().cpu(), tol, "grad weight");
    expect_close(params["bias"].grad().cpu(), b.grad().cpu(), tol, "grad bias");
    expect_close(layer.running_mean.cpu(), rm.cpu(), 1e-5, "running mean");
    expect_close(layer.running_var.cpu(), rv.cpu(), 1e-5, "running var");
    for (at::Tensor t : {params["weight"], params["bias"], w, b}) t.mutable_grad() = at::Tensor();
  }

  at::Tensor w, b, rm, rv;
  kiln::plugin::PluginNormLayer& layer;
  torch::OrderedDict<std::string, at::Tensor> params;
};

class NormLayerVsTorch : public ::testing::TestWithParam<Case> {};

TEST_P(NormLayerVsTorch, ForwardBackwardAndRunningStatsMatch) {
  const Case& c = GetParam();
  at::manual_seed(7);
  const int64_t channels = c.shape[1];
  kiln_norm_request request{sizeof(kiln_norm_request), channels, c.activation, 0, c.param};
  kiln::plugin::PluginNormLayer layer(batchnorm(), options(0.1, 1e-5), request);

  TorchTwin twin(layer, channels);

  for (int step = 0; step < 3; ++step) {
    at::Tensor x = at::randn(c.shape) * 3 + 1;
    at::Tensor x_ref = x.clone().requires_grad_();
    at::Tensor x_k = x.clone().requires_grad_();
    at::Tensor g = at::randn(c.shape);

    at::Tensor y_ref = twin.forward(x_ref, true);
    if (c.activation == KILN_ACT_RELU) y_ref = at::relu(y_ref);
    if (c.activation == KILN_ACT_LEAKY_RELU) y_ref = at::leaky_relu(y_ref, c.param);
    at::Tensor y_k = layer.forward(x_k);
    expect_close(y_k, y_ref, 1e-5, "output");

    (y_ref * g).sum().backward();
    (y_k * g).sum().backward();
    expect_close(x_k.grad(), x_ref.grad(), 1e-5, "grad input");
    twin.expect_same_state(1e-5);
  }

  // Evaluation mode normalises with the running statistics.
  layer.eval();
  at::Tensor x = at::randn(c.shape);
  at::Tensor y_ref = at::batch_norm(x, twin.w.detach(), twin.b.detach(), twin.rm, twin.rv, false,
                                    0.1, 1e-5, false);
  if (c.activation == KILN_ACT_RELU) y_ref = at::relu(y_ref);
  if (c.activation == KILN_ACT_LEAKY_RELU) y_ref = at::leaky_relu(y_ref, c.param);
  at::NoGradGuard no_grad;
  expect_close(layer.forward(x), y_ref, 1e-5, "eval output");
}

INSTANTIATE_TEST_SUITE_P(Shapes, NormLayerVsTorch,
                         ::testing::Values(Case{{8, 4, 5, 5}, KILN_ACT_NONE, 0.0},
                                           Case{{8, 4, 5, 5}, KILN_ACT_RELU, 0.0},
                                           Case{{16, 6}, KILN_ACT_LEAKY_RELU, 0.01},
                                           Case{{2, 3, 7, 3}, KILN_ACT_NONE, 0.0}));

// affine = false (torch's BatchNorm2d(affine=False)): no weight or bias, the same output,
// input gradient and running statistics as ATen's batch norm without them.
TEST(NormLayer, WithoutAffineMatchesTorch) {
  at::manual_seed(3);
  kiln_norm_request request{sizeof(kiln_norm_request), 4, KILN_ACT_NONE, 0, 0.0};
  kiln::plugin::PluginNormLayer layer(batchnorm(), without(options(0.1, 1e-5), "affine"), request);
  EXPECT_TRUE(layer.named_parameters().is_empty());
  at::Tensor rm_ref = at::zeros({4}), rv_ref = at::ones({4});
  for (int step = 0; step < 2; ++step) {
    at::Tensor x = at::randn({6, 4, 3, 3}) * 2 + 1;
    at::Tensor x_ref = x.clone().requires_grad_(), x_k = x.clone().requires_grad_();
    at::Tensor g = at::randn({6, 4, 3, 3});
    at::Tensor y_ref = at::batch_norm(x_ref, {}, {}, rm_ref, rv_ref, true, 0.1, 1e-5, false);
    at::Tensor y_k = layer.forward(x_k);
    expect_close(y_k, y_ref, 1e-5, "output");
    (y_ref * g).sum().backward();
    (y_k * g).sum().backward();
    expect_close(x_k.grad(), x_ref.grad(), 1e-5, "grad input");
    expect_close(layer.running_mean, rm_ref, 1e-5, "running mean");
    expect_close(layer.running_var, rv_ref, 1e-5, "running var");
  }
}

TEST(NormLayer, ParametersAndBuffersAreNamedAsTorchNamesThem) {
  kiln_norm_request request{sizeof(kiln_norm_request), 5, KILN_ACT_NONE, 0, 0.0};
  kiln::plugin::PluginNormLayer layer(batchnorm(), options(0.1, 1e-5), request);
  auto params = layer.named_parameters();
  auto buffers = layer.named_buffers();
  EXPECT_TRUE(params.contains("weight"));
  EXPECT_TRUE(params.contains("bias"));
  EXPECT_TRUE(buffers.contains("running_mean"));
  EXPECT_TRUE(buffers.contains("running_var"));
}

// An in-place layer (inplace_abn) writes over the model's tensor only where the model allowed
// it; autograd then knows the tensor changed. Without permission it works on a copy, and both
// give the same output and gradients.
TEST(NormLayer, InPlaceLayersOverwriteOnlyWhatTheModelAllows) {
  at::manual_seed(3);
  const at::Tensor x0 = at::randn({6, 4, 3, 3});
  const at::Tensor gy = at::randn({6, 4, 3, 3});
  std::vector<at::Tensor> outputs, grads;
  for (int32_t allow : {0, 1}) {
    kiln_norm_request request{sizeof(kiln_norm_request), 4, KILN_ACT_LEAKY_RELU, allow, 0.01};
    kiln::plugin::PluginNormLayer layer(norm("inplace_abn"), options(0.1, 1e-5), request);
    at::Tensor leaf = x0.clone().requires_grad_(true);
    at::Tensor x = leaf * 1.0;  // a non-leaf, as a conv output is
    const void* memory = x.data_ptr();
    at::Tensor y = layer.forward(x);
    EXPECT_EQ(y.data_ptr() == memory, allow == 1);
    EXPECT_EQ(at::equal(x, x0), allow == 0) << "the model's tensor changed only when allowed";
    y.backward(gy);
    outputs.push_back(y.detach());
    grads.push_back(leaf.grad());
  }
  expect_close(outputs[1], outputs[0], 1e-6, "output");
  expect_close(grads[1], grads[0], 1e-6, "input gradient");
  // Overwritten and then read by something that saved it: autograd refuses, it does not
  // silently compute from the overwritten values.
  kiln_norm_request request{sizeof(kiln_norm_request), 4, KILN_ACT_LEAKY_RELU, 1, 0.01};
  kiln::plugin::PluginNormLayer layer(norm("inplace_abn"), options(0.1, 1e-5), request);
  at::Tensor leaf = x0.clone().requires_grad_(true);
  at::Tensor x = leaf * 1.0;
  at::Tensor kept = x.sin();  // saves x for its backward
  at::Tensor y = layer.forward(x);
  EXPECT_THROW((y.sum() + kept.sum()).backward(), c10::Error);
}

// frozen_bn: weight and bias are buffers (no optimizer sees them), nothing is saved for backward
// and the input gradient is grad * weight * rsqrt(running_var + eps).
TEST(NormLayer, FrozenLayersKeepWeightAndBiasAsBuffers) {
  kiln_norm_request request{sizeof(kiln_norm_request), 3, KILN_ACT_NONE, 0, 0.0};
  OptionSet o;
  kiln::plugin::PluginNormLayer layer(norm("frozen_bn"), o, request);
  EXPECT_TRUE(layer.named_parameters().is_empty());
  const auto buffers = layer.named_buffers();
  for (const char* name : {"weight", "bias", "running_mean", "running_var"}) {
    EXPECT_TRUE(buffers.contains(name)) << name;
  }
  buffers["weight"].copy_(at::tensor({2.0f, -1.0f, 0.5f}));
  buffers["running_var"].copy_(at::tensor({3.0f, 0.0f, 1.0f}));
  at::Tensor x = at::randn({4, 3, 2, 2}).requires_grad_(true);
  at::Tensor y = layer.forward(x);
  y.backward(at::ones_like(y));
  const at::Tensor scale =
      at::tensor({2.0f, -1.0f, 0.5f}) * (at::tensor({3.0f, 0.0f, 1.0f}) + 1e-5).rsqrt();
  expect_close(x.grad(), scale.view({1, 3, 1, 1}).expand_as(x), 1e-6, "input gradient");
}

// ---- a plugin that hands over a wrong gradient (ABI 1.3) ----------------------------------------

// batchnorm's vtable with a backward that swaps its grad_bias for one of C + 1 elements, whose
// release is counted: the host must refuse it by name and shape, and still release it.
const kiln_norm_vtable* g_batchnorm = nullptr;
int g_released = 0;

struct Counted {
  DLManagedTensor outer;
  DLManagedTensor* inner;
};

void release_counted(DLManagedTensor* self) {
  auto* counted = reinterpret_cast<Counted*>(self);
  counted->inner->deleter(counted->inner);
  ++g_released;
  delete counted;
}

kiln_status* wrong_bias_backward(void* instance, kiln_call_context* ctx,
                                 const kiln_norm_backward_args* args) {
  kiln_status* status = g_batchnorm->backward(instance, ctx, args);
  if (status != nullptr || args->grad_bias_result == nullptr) return status;
  DLManagedTensor* right = *args->grad_bias_result;
  const int64_t channels = right->dl_tensor.shape[0];
  right->deleter(right);
  auto* counted = new Counted{{}, at::toDLPack(at::zeros({channels + 1}))};
  counted->outer.dl_tensor = counted->inner->dl_tensor;
  counted->outer.deleter = &release_counted;
  *args->grad_bias_result = &counted->outer;
  return nullptr;
}

TEST(NormLayer, AHandedOverGradientOfTheWrongShapeIsRefusedAndReleased) {
  const kiln::plugin::Component& real = batchnorm();
  g_batchnorm = static_cast<const kiln_norm_vtable*>(real.descriptor->vtable);
  kiln_norm_vtable vtable = *g_batchnorm;
  vtable.backward = &wrong_bias_backward;
  kiln_component_descriptor descriptor = *real.descriptor;
  descriptor.vtable = &vtable;
  kiln::plugin::Component wrong = real;
  wrong.descriptor = &descriptor;

  kiln_norm_request request{sizeof(kiln_norm_request), 3, KILN_ACT_NONE, 0, 0.0};
  kiln::plugin::PluginNormLayer layer(wrong, options(0.1, 1e-5), request);
  at::Tensor x = at::randn({4, 3, 2, 2}).requires_grad_(true);
  g_released = 0;
  try {
    layer.forward(x).sum().backward();
    FAIL() << "a grad_bias of the wrong shape was accepted";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("norm 'batchnorm' backward grad_bias: handed over"), std::string::npos)
        << what;
    EXPECT_NE(what.find("[4]"), std::string::npos) << what;
    EXPECT_NE(what.find("[3]"), std::string::npos) << what;
  }
  EXPECT_EQ(g_released, 1) << "the refused tensor must be released once";
}

// ---- what a forward keeps for its backward (ABI 1.11) ------------------------------------------

// batchnorm's vtable whose backward records whether it was lent a reserve (and, when the forward
// stored its own, what it holds). With g_store_reserve, the forward stores a counted reserve of 4
// floats 10..13 over whatever batchnorm stored (the cuDNN route's is only on CUDA); with
// g_reserve_fails, it then fails.
bool g_store_reserve = true;
bool g_reserve_fails = false;
bool g_backward_lent = false;
std::vector<float> g_lent;
at::ScalarType g_lent_type = at::ScalarType::Undefined;  // the lent reserve's dtype
bool g_output_lent = false;  // backward was lent the forward's output (ABI 1.12)

kiln_status* reserving_forward(void* instance, kiln_call_context* ctx,
                               const kiln_norm_forward_args* args) {
  kiln_status* status = g_batchnorm->forward(instance, ctx, args);
  if (status != nullptr || !g_store_reserve) return status;
  EXPECT_TRUE(KILN_HAS_FIELD(args, kiln_norm_forward_args, reserve_result));
  EXPECT_NE(args->reserve_result, nullptr);
  EXPECT_EQ(*args->reserve_result, nullptr) << "the host's slot must start empty";
  auto* counted = new Counted{{}, at::toDLPack(at::arange(4, at::kFloat) + 10)};
  counted->outer.dl_tensor = counted->inner->dl_tensor;
  counted->outer.deleter = &release_counted;
  *args->reserve_result = &counted->outer;
  return g_reserve_fails ? kiln::plugin::host_api()->make_status(KILN_ERR_INTERNAL, "forward broke")
                         : nullptr;
}

kiln_status* lent_backward(void* instance, kiln_call_context* ctx,
                           const kiln_norm_backward_args* args) {
  EXPECT_TRUE(KILN_HAS_FIELD(args, kiln_norm_backward_args, reserve));
  g_lent.clear();
  g_backward_lent = args->reserve != nullptr;
  g_lent_type = args->reserve != nullptr ? kiln::as_tensor(*args->reserve).scalar_type()
                                         : at::ScalarType::Undefined;
  g_output_lent =
      KILN_HAS_FIELD(args, kiln_norm_backward_args, saved_output) && args->saved_output != nullptr;
  if (g_store_reserve && args->reserve != nullptr) {
    const at::Tensor lent = kiln::as_tensor(*args->reserve);
    g_lent.assign(lent.data_ptr<float>(), lent.data_ptr<float>() + lent.numel());
  }
  return g_batchnorm->backward(instance, ctx, args);
}

struct ReservingBatchNorm {
  ReservingBatchNorm() : real(batchnorm()), vtable(*vtable_of(real)), descriptor(*real.descriptor) {
    g_batchnorm = vtable_of(real);
    vtable.forward = &reserving_forward;
    vtable.backward = &lent_backward;
    descriptor.vtable = &vtable;
    component = real;
    component.descriptor = &descriptor;
  }
  static const kiln_norm_vtable* vtable_of(const kiln::plugin::Component& c) {
    return static_cast<const kiln_norm_vtable*>(c.descriptor->vtable);
  }
  const kiln::plugin::Component& real;
  kiln_norm_vtable vtable;
  kiln_component_descriptor descriptor;
  kiln::plugin::Component component;
};

TEST(NormLayer, TheForwardsReserveIsLentToItsBackwardAndReleasedOnce) {
  ReservingBatchNorm wrapped;
  kiln_norm_request request{sizeof(kiln_norm_request), 3, KILN_ACT_NONE, 0, 0.0};
  // ATen's kernels (fused = false), the path beside batchnorm's cuDNN route: a reserve lent to a
  // CPU layer must not send its backward to cuDNN.
  const OptionSet aten = without(options(0.1, 1e-5), "fused");
  kiln::plugin::PluginNormLayer layer(wrapped.component, aten, request);
  kiln::plugin::PluginNormLayer plain(batchnorm(), aten, request);
  at::manual_seed(5);
  const at::Tensor x = at::randn({4, 3, 2, 2});
  const at::Tensor g = at::randn({4, 3, 2, 2});
  g_store_reserve = true;
  g_reserve_fails = false;
  g_released = 0;
  g_lent.clear();
  at::Tensor xa = x.clone().requires_grad_(true);
  at::Tensor y = layer.forward(xa);
  EXPECT_EQ(g_released, 0) << "the host must keep the reserve until the backward";
  (y * g).sum().backward();
  EXPECT_EQ(g_lent, (std::vector<float>{10, 11, 12, 13}));
  y = at::Tensor();  // the graph, and what it saved, goes with the last reference to its output
  EXPECT_EQ(g_released, 1) << "released once, when autograd is done with it";
  // Keeping it changes nothing else: the same gradients as the layer without it.
  at::Tensor xb = x.clone().requires_grad_(true);
  (plain.forward(xb) * g).sum().backward();
  EXPECT_TRUE(at::equal(xa.grad(), xb.grad()));

  // A forward that fails after storing one: refused by name, the reserve released at once.
  g_reserve_fails = true;
  g_released = 0;
  try {
    (void)layer.forward(x.clone().requires_grad_(true));
    FAIL() << "a failed forward was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("forward broke"), std::string::npos) << e.what();
  }
  EXPECT_EQ(g_released, 1);
  g_reserve_fails = false;
}

// On CUDA the batchnorm plugin runs a training layer on cuDNN where ATen's batch_norm does
// (AMP's half channels-last input with float parameters, and float32): the same output, gradients
// and running statistics as ATen's batch_norm, and the backward is lent the forward's reserve.
struct CudaCase {
  const char* name;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  bool channels_last;
  int32_t activation = KILN_ACT_NONE;
};

class NormLayerOnCuda : public ::testing::TestWithParam<CudaCase> {};

TEST_P(NormLayerOnCuda, TakesTorchsBackendAndMatchesIt) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const CudaCase& c = GetParam();
  const at::Device cuda(at::kCUDA);
  const int64_t channels = c.shape[1];
  ReservingBatchNorm wrapped;
  g_store_reserve = false;
  g_reserve_fails = false;
  kiln_norm_request request{sizeof(kiln_norm_request), channels, c.activation, 0, 0.0};
  kiln::plugin::PluginNormLayer layer(wrapped.component, options(0.1, 1e-5), request, 1, nullptr,
                                      nullptr, c10::kCUDA);
  layer.to(cuda);
  // With a ReLU the layer applies it and keeps its output for the backward (ABI 1.12); on half
  // channels-last data in cuDNN's fused kernels (an int8 reserve), else after the plain route
  // (ATen's uint8 reserve), the mask read from the kept output.
  const bool relu = c.activation == KILN_ACT_RELU;
  const bool fused = relu && c.dtype == at::kHalf && c.channels_last;
  EXPECT_EQ(layer.layout().fused_activation, relu ? 1 : 0);
  EXPECT_EQ(layer.layout().saves, relu ? KILN_NORM_SAVE_INPUT_AND_OUTPUT : KILN_NORM_SAVE_INPUT);
  at::manual_seed(11);
  const auto f32 = at::TensorOptions().device(cuda).dtype(at::kFloat);
  TorchTwin twin(layer, channels, f32);
  // Half data: both sides round the same float results to half; 2e-3 of the largest value.
  const double tol = c.dtype == at::kHalf ? 2e-3 : 1e-5;
  // Both sides run cuDNN: the running statistics are also held to the definition (momentum 0.1,
  // the batch's unbiased variance, in double from the same input).
  at::Tensor rm = at::zeros({channels}, at::kDouble), rv = at::ones({channels}, at::kDouble);
  for (int step = 0; step < 2; ++step) {
    at::Tensor x = (at::randn(c.shape, f32) * 3 + 1).to(c.dtype);
    if (c.channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    const at::Tensor g = at::randn(c.shape, f32).to(c.dtype).contiguous(x.suggest_memory_format());
    EXPECT_EQ(
        at::native::_select_batch_norm_backend(x, twin.w, twin.b, twin.rm, twin.rv, true, 1e-5),
        at::native::BatchNormBackend::Cudnn);
    at::Tensor x_ref = x.clone().requires_grad_();
    at::Tensor x_k = x.clone().requires_grad_();
    at::Tensor y_ref = twin.forward(x_ref, true, /*cudnn=*/true);
    if (relu) y_ref = at::relu(y_ref);
    at::Tensor y_k = layer.forward(x_k);
    EXPECT_EQ(y_k.scalar_type(), c.dtype);
    EXPECT_EQ(y_k.strides(), x.strides());
    expect_close(y_k.to(at::kFloat).cpu(), y_ref.to(at::kFloat).cpu(), tol, "output");
    g_backward_lent = false;
    y_ref.backward(g);
    y_k.backward(g);
    EXPECT_TRUE(g_backward_lent) << "the forward took cuDNN and handed its reserve over";
    EXPECT_EQ(g_lent_type, fused ? at::kChar : at::kByte) << "cuDNN's fused route, or the plain";
    EXPECT_EQ(g_output_lent, relu);
    expect_close(x_k.grad().to(at::kFloat).cpu(), x_ref.grad().to(at::kFloat).cpu(), tol,
                 "grad input");
    const at::Tensor per_channel = x.to(at::kDouble).cpu().transpose(0, 1).reshape({channels, -1});
    rm = 0.9 * rm + 0.1 * per_channel.mean(1);
    rv = 0.9 * rv + 0.1 * per_channel.var(1, /*unbiased=*/true);
    expect_close(layer.running_mean.cpu().to(at::kDouble), rm, 1e-5, "running mean, defined");
    expect_close(layer.running_var.cpu().to(at::kDouble), rv, 1e-5, "running var, defined");
    twin.expect_same_state(tol);
  }
  g_store_reserve = true;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, NormLayerOnCuda,
    ::testing::Values(
        CudaCase{"half_channels_last", {16, 32, 7, 7}, at::kHalf, true},
        CudaCase{"float_nchw", {8, 4, 5, 5}, at::kFloat, false},
        CudaCase{"half_channels_last_relu", {16, 32, 7, 7}, at::kHalf, true, KILN_ACT_RELU},
        CudaCase{"float_nchw_relu", {8, 4, 5, 5}, at::kFloat, false, KILN_ACT_RELU}),
    [](const auto& info) { return std::string(info.param.name); });

// ---- a norm layer in plain C that keeps x-hat in its forward's reserve (ABI 1.11) ---------------

// tests/plugins/good_c_norm.c ("c_bn") asks the host to save nothing and reads x-hat back from the
// reserve its forward handed over: through the host's autograd function it equals ATen's batch norm
// (output, gradients, running statistics; any strides), and every reserve is released.
const std::string kCNormPath = std::string(KILN_TEST_PLUGIN_DIR) + "/good/libgood_c_norm.so";

const kiln::plugin::Component& c_norm() {
  static kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
  static const kiln::plugin::Registry registry = [] {
    kiln::plugin::Registry r;
    loader.load_library(kCNormPath, r);
    return r;
  }();
  return *registry.find(KILN_COMPONENT_NORM, "c_bn");
}

TEST(NormLayer, APlainCLayerKeepingItsOwnSavedTensorMatchesTorch) {
  const kiln::plugin::Component& c_bn = c_norm();
  void* library = dlopen(kCNormPath.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(library, nullptr);
  auto live = reinterpret_cast<int (*)()>(dlsym(library, "c_bn_live_reserves"));
  ASSERT_NE(live, nullptr);

  at::manual_seed(17);
  const int64_t channels = 3;
  kiln_norm_request request{sizeof(kiln_norm_request), channels, KILN_ACT_NONE, 0, 0.0};
  kiln::plugin::PluginNormLayer layer(c_bn, options(0.1, 1e-5), request);
  EXPECT_EQ(layer.layout().saves, KILN_NORM_SAVE_NOTHING);
  TorchTwin twin(layer, channels);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const bool training = step < 2;
    layer.train(training);
    // The second step's input is channels-last: the plugin walks any strides.
    at::Tensor x = at::randn({6, channels, 4, 5}) * 2 + 1;
    if (step == 1) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    const at::Tensor g = at::randn({6, channels, 4, 5});
    at::Tensor x_ref = x.clone().requires_grad_(), x_k = x.clone().requires_grad_();
    at::Tensor y_ref = twin.forward(x_ref, training);
    at::Tensor y_k = layer.forward(x_k);
    EXPECT_EQ(live(), 1) << "the host keeps the forward's reserve for the backward";
    expect_close(y_k, y_ref, 1e-5, "output");
    (y_ref * g).sum().backward();
    (y_k * g).sum().backward();
    expect_close(x_k.grad(), x_ref.grad(), 1e-5, "grad input");
    twin.expect_same_state(1e-5);
    EXPECT_EQ(live(), 0) << "released once the backward is done with it";
  }
  dlclose(library);
}

// ---- a layer whose backward reads its input and its output (ABI 1.12) --------------------------

// good_c_norm.c with relu = true applies the model's ReLU and keeps no reserve: the host keeps the
// forward's input and output (KILN_NORM_SAVE_INPUT_AND_OUTPUT) and lends both to the backward,
// which recomputes x-hat from the input and takes the ReLU's mask from the output. Through the
// host's autograd function that equals ATen's batch norm followed by a ReLU (output, gradients,
// running statistics; training and evaluation, any strides).
TEST(NormLayer, APlainCLayerGivenItsInputAndOutputBackMatchesTorchWithItsRelu) {
  const kiln::plugin::Component& c_bn = c_norm();
  void* library = dlopen(kCNormPath.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(library, nullptr);
  auto live = reinterpret_cast<int (*)()>(dlsym(library, "c_bn_live_reserves"));
  ASSERT_NE(live, nullptr);
  OptionSet o = options(0.1, 1e-5);
  Value yes;
  yes.type = KILN_OPT_BOOL;
  yes.bool_value = true;
  o.set("relu", yes);
  at::manual_seed(19);
  const int64_t channels = 3;
  kiln_norm_request request{sizeof(kiln_norm_request), channels, KILN_ACT_RELU, 0, 0.0};
  kiln::plugin::PluginNormLayer layer(c_bn, o, request);
  EXPECT_EQ(layer.layout().saves, KILN_NORM_SAVE_INPUT_AND_OUTPUT);
  EXPECT_EQ(layer.layout().fused_activation, 1);
  TorchTwin twin(layer, channels);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const bool training = step < 2;
    layer.train(training);
    // About half of each channel below zero after the affine map, so the mask matters.
    at::Tensor x = at::randn({6, channels, 4, 5}) * 2 + 0.3;
    if (step == 1) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    const at::Tensor g = at::randn({6, channels, 4, 5});
    at::Tensor x_ref = x.clone().requires_grad_(), x_k = x.clone().requires_grad_();
    at::Tensor y_ref = at::relu(twin.forward(x_ref, training));
    at::Tensor y_k = layer.forward(x_k);
    EXPECT_EQ(live(), 0) << "this layer keeps no reserve";
    expect_close(y_k, y_ref, 1e-5, "output");
    EXPECT_GT((y_k == 0).sum().item<int64_t>(), 0) << "no value fell under the ReLU";
    (y_ref * g).sum().backward();
    (y_k * g).sum().backward();
    expect_close(x_k.grad(), x_ref.grad(), 1e-5, "grad input");
    twin.expect_same_state(1e-5);
  }
  dlclose(library);
}

// batchnorm told the run trains on CUDA with a ReLU keeps input and output (which also says it
// found cuDNN's fused functions in the libcudnn libtorch_cuda loaded, GPU or not); where cuDNN's
// fused kernels do not take the data (here a strided view on the CPU, which the fused CPU kernels
// do not take either) it applies the ReLU after ATen's kernels and takes the gradient through it
// from the kept output: torch's batch norm + ReLU.
TEST(NormLayer, ACudaReluLayerOffCudnnsFusedRouteMatchesTorch) {
  ReservingBatchNorm wrapped;
  g_store_reserve = false;
  g_reserve_fails = false;
  const int64_t channels = 4;
  kiln_norm_request request{sizeof(kiln_norm_request), channels, KILN_ACT_RELU, 0, 0.0};
  kiln::plugin::PluginNormLayer layer(wrapped.component, options(0.1, 1e-5), request, 1, nullptr,
                                      nullptr, c10::kCUDA);
  EXPECT_EQ(layer.layout().saves, KILN_NORM_SAVE_INPUT_AND_OUTPUT);
  EXPECT_EQ(layer.layout().fused_activation, 1);
  // fused = false keeps ATen's kernels and the host's ReLU, on CUDA too.
  kiln::plugin::PluginNormLayer plain(batchnorm(), without(options(0.1, 1e-5), "fused"), request, 1,
                                      nullptr, nullptr, c10::kCUDA);
  EXPECT_EQ(plain.layout().saves, KILN_NORM_SAVE_INPUT);
  EXPECT_EQ(plain.layout().fused_activation, 0);
  at::manual_seed(23);
  TorchTwin twin(layer, channels);
  for (int step = 0; step < 2; ++step) {
    at::Tensor x = (at::randn({5, channels, 3, 6}) * 2 + 0.3).slice(3, 0, 6, 2);
    ASSERT_FALSE(x.is_non_overlapping_and_dense());
    const at::Tensor g = at::randn({5, channels, 3, 3});
    at::Tensor x_ref = x.clone().requires_grad_(), x_k = x.clone().requires_grad_();
    at::Tensor y_ref = at::relu(twin.forward(x_ref, true));
    at::Tensor y_k = layer.forward(x_k);
    expect_close(y_k, y_ref, 1e-5, "output");
    g_output_lent = false;
    (y_ref * g).sum().backward();
    (y_k * g).sum().backward();
    EXPECT_TRUE(g_output_lent) << "the backward was lent the forward's output";
    expect_close(x_k.grad(), x_ref.grad(), 1e-5, "grad input");
    twin.expect_same_state(1e-5);
  }
  g_store_reserve = true;
}

// A layout.saves the host does not know is refused at create, naming the plugin, before any
// forward could save the wrong tensor; so is keeping input and output of a layer that writes its
// output over its input.
const kiln_norm_vtable* g_odd_norm = nullptr;
bool g_odd_in_place = false;  // the second case: input and output of an in-place layer

kiln_status* odd_saves_create(const kiln_host_api* host, const kiln_options* options,
                              const kiln_norm_setup* setup, kiln_norm_layout* layout, void** out) {
  kiln_status* status = g_odd_norm->create(host, options, setup, layout, out);
  layout->saves = g_odd_in_place ? KILN_NORM_SAVE_INPUT_AND_OUTPUT : 9;
  layout->in_place = g_odd_in_place ? 1 : 0;
  return status;
}

TEST(NormLayer, ALayoutSavingWhatTheHostCannotKeepIsRefused) {
  const kiln::plugin::Component& real = batchnorm();
  g_odd_norm = static_cast<const kiln_norm_vtable*>(real.descriptor->vtable);
  kiln_norm_vtable vtable = *g_odd_norm;
  vtable.create = &odd_saves_create;
  kiln_component_descriptor descriptor = *real.descriptor;
  descriptor.vtable = &vtable;
  kiln::plugin::Component odd = real;
  odd.descriptor = &descriptor;
  kiln_norm_request request{sizeof(kiln_norm_request), 3, KILN_ACT_NONE, 0, 0.0};
  g_odd_in_place = false;
  for (const char* expected : {"asks the host to save 9", "writes the output over the input"}) {
    try {
      kiln::plugin::PluginNormLayer layer(odd, options(0.1, 1e-5), request);
      ADD_FAILURE() << "accepted: " << expected;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(expected), std::string::npos) << what;
      EXPECT_NE(what.find("norm 'batchnorm'"), std::string::npos) << what;
    }
    g_odd_in_place = true;
  }
}

// ---- the device the run trains on (ABI 1.9) ---------------------------------------------------

// A norm component's vtable with a create that records the setup it was given (up to the
// setup's struct_size) and then creates as the component does.
const kiln_norm_vtable* g_recorded_norm = nullptr;
std::vector<kiln_norm_setup> g_setups;

kiln_status* recording_create(const kiln_host_api* host, const kiln_options* options,
                              const kiln_norm_setup* setup, kiln_norm_layout* layout, void** out) {
  kiln_norm_setup seen{};
  std::memcpy(&seen, setup, std::min(setup->struct_size, sizeof(seen)));
  g_setups.push_back(seen);
  return g_recorded_norm->create(host, options, setup, layout, out);
}

struct Recording {
  explicit Recording(const kiln::plugin::Component& real)
      : vtable(*static_cast<const kiln_norm_vtable*>(real.descriptor->vtable)),
        descriptor(*real.descriptor),
        component(real) {
    g_recorded_norm = static_cast<const kiln_norm_vtable*>(real.descriptor->vtable);
    g_setups.clear();
    vtable.create = &recording_create;
    descriptor.vtable = &vtable;
    component.descriptor = &descriptor;
  }
  kiln_norm_vtable vtable;
  kiln_component_descriptor descriptor;
  kiln::plugin::Component component;
};

TEST(NormLayer, CreateIsToldTheDeviceTheRunTrainsOn) {
  const Recording recording(batchnorm());
  kiln_norm_request request{sizeof(kiln_norm_request), 3, KILN_ACT_RELU, 0, 0.0};
  kiln::plugin::PluginNormLayer cpu(recording.component, options(0.1, 1e-5), request);
  // A hint only: a layer told CUDA is still made (and would compute) on this machine.
  kiln::plugin::PluginNormLayer cuda(recording.component, options(0.1, 1e-5), request, 1, nullptr,
                                     nullptr, c10::kCUDA);
  kiln::plugin::PluginNormLayer meta(recording.component, options(0.1, 1e-5), request, 1, nullptr,
                                     nullptr, c10::kMeta);
  ASSERT_EQ(g_setups.size(), 3u);
  for (const kiln_norm_setup& setup : g_setups) {
    EXPECT_EQ(setup.struct_size, sizeof(kiln_norm_setup));
    EXPECT_TRUE(KILN_HAS_FIELD(&setup, kiln_norm_setup, device_type));
    EXPECT_EQ(setup.reserved, 0);
    EXPECT_EQ(setup.num_features, 3);
    EXPECT_EQ(setup.world_size, 1);
  }
  EXPECT_EQ(g_setups[0].device_type, 1);  // kDLCPU
  EXPECT_EQ(g_setups[0].device_type, static_cast<int32_t>(kDLCPU));
  EXPECT_EQ(g_setups[1].device_type, 2);  // kDLCUDA
  EXPECT_EQ(g_setups[1].device_type, static_cast<int32_t>(kDLCUDA));
  EXPECT_EQ(g_setups[2].device_type, 0) << "a device the ABI does not name is unknown (0)";
  // A 1.8 plugin reads the setup up to the size it knows, which the field lies beyond.
  EXPECT_EQ(KILN_NORM_SETUP_V1_8_SIZE, offsetof(kiln_norm_setup, device_type));
  at::Tensor x = at::randn({4, 3, 2, 2});
  EXPECT_EQ(cpu.forward(x).sizes(), x.sizes());
}

// build_model, the one path of a run, `kiln validate`, `plan` and `lr-schedule`, passes the
// device it is given to every norm layer the model asks for.
TEST(NormLayer, BuildModelTellsEveryNormLayerTheRunsDevice) {
  static kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
  static const kiln::plugin::Registry registry = [] {
    std::vector<std::string> refused;
    return kiln::plugin::load_all(loader, {KILN_PLUGIN_DIR}, refused);
  }();
  kiln::config::Pipeline p = kiln::config::load_pipeline_text(
      "[model]\nname = \"resnet\"\nwidth = 8\nblocks = [1, 1]\n", "device.toml", {}, registry);
  const Recording recording(*p.norm.component);
  p.norm.component = &recording.component;
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  input.channels = 3;
  input.height = 16;
  input.width = 16;
  input.num_classes = 10;
  const std::pair<c10::DeviceType, int32_t> cases[] = {{c10::kCPU, kDLCPU}, {c10::kCUDA, kDLCUDA}};
  for (const auto& [device, expected] : cases) {
    g_setups.clear();
    (void)kiln::engine::build_model(p, input, device);
    ASSERT_GT(g_setups.size(), 2u) << "the resnet asks for a norm layer per convolution";
    for (const kiln_norm_setup& setup : g_setups) EXPECT_EQ(setup.device_type, expected);
  }
}

// The run's norm factory reaches a model only through its create call: the context
// (create_norm_layer_in, ABI 1.6), or for an older model the binding of the calling thread to
// that context for the call (create_norm_layer). No other thread and no other run sees it.
TEST(NormLayer, TheFactoryIsReachedThroughTheCreateContextOrThisThreadsBinding) {
  const kiln_host_api* host = kiln::plugin::host_api();
  auto factory_of = [](int& calls) -> kiln::plugin::NormFactory {
    return [&calls](const kiln_norm_request& request) {
      ++calls;
      return std::make_shared<kiln::plugin::PluginNormLayer>(batchnorm(), options(0.1, 1e-5),
                                                             request);
    };
  };
  int calls_a = 0, calls_b = 0;
  const kiln::plugin::NormFactory a = factory_of(calls_a), b = factory_of(calls_b);
  kiln_call_context ctx_a, ctx_b;
  ctx_a.norm_factory = &a;
  ctx_b.norm_factory = &b;
  kiln_norm_request request{};
  request.struct_size = sizeof(request);
  request.num_features = 3;
  auto take = [](kiln_status* status, kiln_torch_module* handle) {
    if (status != nullptr) return kiln::plugin::take_message(status);
    delete reinterpret_cast<kiln::ModuleBox<kiln::NormLayer>*>(handle);
    return std::string("ok");
  };
  kiln_torch_module* handle = nullptr;
  ASSERT_TRUE(KILN_HAS_FIELD(host, kiln_host_api, create_norm_layer_in));
  EXPECT_EQ(take(host->create_norm_layer_in(&ctx_a, &request, &handle), handle), "ok");
  EXPECT_EQ(calls_a, 1);
  // Without a binding, the 1.x slot has no run to build for.
  std::string unbound = take(host->create_norm_layer(&request, &handle), handle);
  EXPECT_NE(unbound.find("no norm plugin"), std::string::npos) << unbound;
  {
    const kiln::plugin::ModelCreateBinding outer(&ctx_a);
    {
      const kiln::plugin::ModelCreateBinding inner(&ctx_b);
      EXPECT_EQ(take(host->create_norm_layer(&request, &handle), handle), "ok");
      EXPECT_EQ(calls_b, 1);
      // Another thread, meanwhile, reaches nothing.
      std::string elsewhere;
      std::thread other([&] {
        kiln_torch_module* h = nullptr;
        elsewhere = take(host->create_norm_layer(&request, &h), h);
      });
      other.join();
      EXPECT_NE(elsewhere.find("no norm plugin"), std::string::npos) << elsewhere;
    }
    EXPECT_EQ(take(host->create_norm_layer(&request, &handle), handle), "ok");
    EXPECT_EQ(calls_a, 2);
  }
  EXPECT_NE(take(host->create_norm_layer(&request, &handle), handle), "ok");
  EXPECT_EQ(calls_a + calls_b, 3);
}

}  // namespace
