// Built-in plugins called directly through their vtables with a fake host, checked against
// closed forms and against Python torch (tests/oracle) as the numerical oracle.
#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fake_host.hpp"
#include "kiln/torch.hpp"
#include "kiln_test_paths.h"
#include "tensor_scratch.hpp"

namespace kiln::test {
namespace {

// Expects a NULL status, printing the plugin's message otherwise.
#define EXPECT_KILN_OK(expr)                                \
  do {                                                      \
    Status status_ = take(expr);                            \
    EXPECT_EQ(status_, nullptr) << describe(status_.get()); \
  } while (0)
#define ASSERT_KILN_OK(expr)                                \
  do {                                                      \
    Status status_ = take(expr);                            \
    ASSERT_EQ(status_, nullptr) << describe(status_.get()); \
  } while (0)

template <typename Vtable>
const Vtable& vtable_of(const std::string& library, const std::string& component) {
  return *static_cast<const Vtable*>(component_vtable(library, component));
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol,
                  const std::string& what) {
  const double c = closeness(actual, expected, rtol, atol);
  EXPECT_LE(c, 1.0) << what << ": max error is " << c << " times the tolerance";
}

at::Device test_device(bool cuda) { return cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU); }

// ---- descriptors ------------------------------------------------------------------------------

TEST(PluginDescriptors, BuiltInsAreWellFormed) {
  const std::map<std::string, std::vector<std::string>> expected = {
      {"kiln_sgd", {"sgd"}},
      {"kiln_fp32", {"fp32", "O0", "32-true"}},
      {"kiln_batchnorm", {"batchnorm"}},
      {"kiln_amp",
       {"amp", "bf16", "o2", "o3", "O1", "16-mixed", "bf16-mixed", "O2", "O3", "16-true",
        "bf16-true"}}};
  for (const auto& [library, components] : expected) {
    SCOPED_TRACE(library);
    const Plugin& p = builtin(library);
    EXPECT_EQ(p.probe, KILN_ABI_PACK(KILN_ABI_MAJOR, KILN_ABI_MINOR));
    EXPECT_EQ(p.descriptor->struct_size, sizeof(kiln_plugin_descriptor));
    EXPECT_EQ(p.descriptor->abi_major, KILN_ABI_MAJOR);
    EXPECT_EQ(p.descriptor->abi_minor, KILN_ABI_MINOR);
    // Libraries running ATen (on host memory too) record the LibTorch they were built against.
    if (library == "kiln_sgd" || library == "kiln_batchnorm") {
      ASSERT_NE(p.descriptor->torch_version, nullptr);
      EXPECT_STREQ(p.descriptor->torch_version, KILN_TORCH_VERSION);
      EXPECT_EQ(p.descriptor->torch_cxx11_abi, KILN_TORCH_CXX11_ABI);
    } else {
      EXPECT_EQ(p.descriptor->torch_version, nullptr);
      EXPECT_EQ(p.descriptor->torch_cxx11_abi, -1);
    }
    ASSERT_EQ(p.descriptor->component_count, components.size());
    for (size_t i = 0; i < components.size(); ++i) {
      const kiln_component_descriptor* c = p.descriptor->components[i];
      EXPECT_EQ(c->struct_size, sizeof(kiln_component_descriptor));
      EXPECT_EQ(c->name, components[i]);
      ASSERT_NE(c->capabilities, nullptr);
      EXPECT_EQ(c->capabilities->struct_size, sizeof(kiln_capabilities));
      EXPECT_NE(c->capabilities->flags & KILN_CAP_DEVICE_CPU, 0u);
      ASSERT_NE(c->vtable, nullptr);
      for (size_t o = 0; o < c->option_count; ++o) {
        const kiln_option_spec& spec = c->options[o];
        SCOPED_TRACE(spec.name);
        EXPECT_EQ(spec.struct_size, sizeof(kiln_option_spec));
        EXPECT_NE(spec.default_value, nullptr);
        ASSERT_NE(spec.doc, nullptr);
        EXPECT_GT(std::string(spec.doc).size(), 0u);
      }
    }
  }
}

// ---- precision ----------------------------------------------------------------------------------

TEST(Fp32Precision, DeclaresFullPrecisionPolicy) {
  const kiln_component_descriptor* c = builtin("kiln_fp32").component("fp32");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->kind, KILN_COMPONENT_PRECISION);
  const uint64_t flags = c->capabilities->flags;
  EXPECT_NE(flags & KILN_CAP_DEVICE_CUDA, 0u);
  EXPECT_NE(flags & KILN_CAP_DTYPE_F32, 0u);
  EXPECT_EQ(flags & (KILN_CAP_DTYPE_F16 | KILN_CAP_DTYPE_BF16), 0u);
  const auto& vt = *static_cast<const kiln_precision_vtable*>(c->vtable);
  EXPECT_EQ(vt.update_scale, nullptr);
  void* instance = nullptr;
  Options options;
  ASSERT_KILN_OK(vt.create(fake_host(), options.get(), DLDevice{kDLCPU, 0}, &instance));
  kiln_precision_policy policy{};
  policy.struct_size = sizeof(policy);
  ASSERT_KILN_OK(vt.policy(instance, &policy));
  EXPECT_EQ(policy.struct_size, sizeof(policy));
  EXPECT_EQ(policy.model_dtype, KILN_DTYPE_F32);
  EXPECT_EQ(policy.autocast, 0);
  EXPECT_EQ(policy.compute_dtype, KILN_DTYPE_F32);
  EXPECT_EQ(policy.master_weights, 0);
  EXPECT_EQ(policy.norm_fp32, 1);
  EXPECT_EQ(policy.loss_scaling, KILN_SCALE_NONE);
  EXPECT_EQ(policy.initial_scale, 1.0);

  // An older host's smaller struct: nothing beyond its struct_size is written.
  kiln_precision_policy old{};
  old.struct_size = KILN_SIZE_UP_TO(kiln_precision_policy, compute_dtype);
  old.master_weights = 77;
  old.initial_scale = -3.0;
  ASSERT_KILN_OK(vt.policy(instance, &old));
  EXPECT_EQ(old.compute_dtype, KILN_DTYPE_F32);
  EXPECT_EQ(old.master_weights, 77);
  EXPECT_EQ(old.initial_scale, -3.0);
  vt.destroy(instance);
}

// ---- optimizers ---------------------------------------------------------------------------------

// Runs `steps` optimizer steps over `params` (updated in place) with grads[i][step].
void run_optimizer(const kiln_optimizer_vtable& vt, void* instance, kiln_call_context& ctx,
                   std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                   const std::vector<double>& lrs, double weight_decay) {
  std::vector<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) names.push_back("p" + std::to_string(i));
  std::vector<const char*> name_ptrs;
  for (const auto& n : names) name_ptrs.push_back(n.c_str());
  ctx.params = params;
  for (size_t step = 0; step < lrs.size(); ++step) {
    std::vector<at::Tensor> grad_views;
    std::vector<DLTensor> p_dl, g_dl;
    for (size_t i = 0; i < params.size(); ++i) {
      grad_views.push_back(grads[i][static_cast<int64_t>(step)]);
      p_dl.push_back(kiln::as_dltensor(params[i]));
      g_dl.push_back(kiln::as_dltensor(grad_views.back()));
    }
    kiln_param_group group{};
    group.struct_size = sizeof(group);
    group.count = params.size();
    group.params = p_dl.data();
    group.grads = g_dl.data();
    group.names = name_ptrs.data();
    group.step = static_cast<int64_t>(step) + 1;
    group.lr = lrs[step];
    group.weight_decay = weight_decay;
    ASSERT_KILN_OK(vt.step(instance, &ctx, &group));
  }
}

struct SgdCase {
  std::string name;
  double momentum, dampening;
  bool nesterov;
  double weight_decay;
  bool cuda;
};

class SgdVsTorch : public ::testing::TestWithParam<SgdCase> {};

TEST_P(SgdVsTorch, TwentySteps) {
  const SgdCase& c = GetParam();
  if (c.cuda && !at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(7);
  const int64_t steps = 20;
  const std::vector<std::vector<int64_t>> shapes = {{5, 7}, {13}, {2, 3, 4}};
  std::vector<double> lrs;
  for (int64_t s = 0; s < steps; ++s) lrs.push_back(0.1 * (1.0 - 0.03 * s));

  TensorScratch oracle;
  std::vector<at::Tensor> params, grads;
  for (size_t i = 0; i < shapes.size(); ++i) {
    at::Tensor p = at::randn(shapes[i]);
    std::vector<int64_t> grad_shape = {steps};
    grad_shape.insert(grad_shape.end(), shapes[i].begin(), shapes[i].end());
    at::Tensor g = at::randn(grad_shape);
    oracle.write("p" + std::to_string(i) + ".bin", p);
    oracle.write("g" + std::to_string(i) + ".bin", g);
    p = p.to(test_device(c.cuda));
    // The first parameter is a transposed (non-contiguous) view, as a host might hand over.
    if (i == 0) p = p.t().contiguous().t();
    params.push_back(p);
    grads.push_back(g.to(test_device(c.cuda)));
  }
  std::ostringstream config;
  config << "{\"steps\": " << steps << ", \"shapes\": [[5, 7], [13], [2, 3, 4]], \"lrs\": [";
  for (size_t s = 0; s < lrs.size(); ++s) config << (s ? ", " : "") << lrs[s];
  config << "], \"momentum\": " << c.momentum << ", \"dampening\": " << c.dampening
         << ", \"nesterov\": " << (c.nesterov ? "true" : "false")
         << ", \"weight_decay\": " << c.weight_decay << "}";
  oracle.write_text("config.json", config.str());
  oracle.run("sgd.py");

  const auto& vt = vtable_of<kiln_optimizer_vtable>("kiln_sgd", "sgd");
  Options options;
  options.set_float("momentum", c.momentum)
      .set_float("dampening", c.dampening)
      .set_bool("nesterov", c.nesterov);
  void* instance = nullptr;
  ASSERT_KILN_OK(vt.create(fake_host(), options.get(), &instance));
  kiln_call_context ctx;
  run_optimizer(vt, instance, ctx, params, grads, lrs, c.weight_decay);
  vt.destroy(instance);

  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string n = std::to_string(i);
    expect_close(params[i], oracle.read("p" + n + "_out.bin", shapes[i]), 1e-6, 1e-7, "param " + n);
    auto buf = ctx.state.find({i, "momentum_buffer"});
    if (c.momentum == 0.0) {
      EXPECT_EQ(buf, ctx.state.end()) << "plain SGD should keep no state";
    } else {
      ASSERT_NE(buf, ctx.state.end());
      expect_close(buf->second, oracle.read("buf" + n + "_out.bin", shapes[i]), 1e-6, 1e-7,
                   "momentum_buffer " + n);
    }
  }
}

std::vector<SgdCase> sgd_cases() {
  std::vector<SgdCase> cases = {{"plain", 0.0, 0.0, false, 0.0, false},
                                {"weight_decay", 0.0, 0.0, false, 1e-2, false},
                                {"momentum", 0.9, 0.0, false, 0.0, false},
                                {"momentum_wd", 0.9, 0.0, false, 5e-4, false},
                                {"dampening_wd", 0.8, 0.3, false, 1e-2, false},
                                {"nesterov", 0.9, 0.0, true, 0.0, false},
                                {"nesterov_wd", 0.7, 0.0, true, 1e-2, false}};
  for (size_t i = 0, n = cases.size(); i < n; ++i) {
    SgdCase cuda = cases[i];
    cuda.name += "_cuda";
    cuda.cuda = true;
    cases.push_back(cuda);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Combos, SgdVsTorch, ::testing::ValuesIn(sgd_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Sgd, RefusesInvalidNesterov) {
  const auto& vt = vtable_of<kiln_optimizer_vtable>("kiln_sgd", "sgd");
  for (auto [momentum, dampening] : {std::pair{0.9, 0.5}, std::pair{0.0, 0.0}}) {
    Options options;
    options.set_float("momentum", momentum).set_float("dampening", dampening);
    options.set_bool("nesterov", true);
    void* instance = nullptr;
    Status status = take(vt.create(fake_host(), options.get(), &instance));
    ASSERT_NE(status, nullptr);
    EXPECT_EQ(status->code, KILN_ERR_INVALID_ARGUMENT);
    EXPECT_NE(status->message.find("nesterov"), std::string::npos) << status->message;
  }
}

TEST(CSgd, MatchesClosedFormOnStridedViews) {
  const Plugin p = open_plugin(KILN_TEST_PLUGIN_DIR "/good", "good_c_optimizer");
  const kiln_component_descriptor* c = p.component("c_sgd");
  ASSERT_NE(c, nullptr);
  const auto& vt = *static_cast<const kiln_optimizer_vtable*>(c->vtable);
  at::manual_seed(3);
  const int64_t steps = 3;
  const double wd = 0.01;
  const std::vector<double> lrs = {0.05, 0.04, 0.03};
  std::vector<at::Tensor> params = {at::randn({7, 5}).t(), at::randn({11})};
  std::vector<at::Tensor> grads = {at::randn({steps, 5, 7}), at::randn({steps, 11})};
  // The gradient of the first parameter is itself a strided slice.
  grads[0] = at::randn({steps, 7, 5}).transpose(1, 2);
  std::vector<at::Tensor> expected;
  for (const auto& t : params) expected.push_back(t.to(at::kDouble));
  for (int64_t s = 0; s < steps; ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      expected[i] = expected[i] - lrs[s] * (grads[i][s].to(at::kDouble) + wd * expected[i]);
    }
  }
  void* instance = nullptr;
  Options options;
  ASSERT_KILN_OK(vt.create(fake_host(), options.get(), &instance));
  kiln_call_context ctx;
  run_optimizer(vt, instance, ctx, params, grads, lrs, wd);
  vt.destroy(instance);
  for (size_t i = 0; i < params.size(); ++i) {
    expect_close(params[i], expected[i], 1e-6, 1e-7, "c_sgd param " + std::to_string(i));
  }
}

// ---- batchnorm ----------------------------------------------------------------------------------

struct BnCase {
  std::string name;
  std::vector<int64_t> shape;
  bool affine, track;
  double momentum, eps;
  bool cuda;
};

class BatchNormVsTorch : public ::testing::TestWithParam<BnCase> {};

DLTensor* dl_or_null(const at::Tensor& t, DLTensor& storage) {
  if (!t.defined()) return nullptr;
  storage = kiln::as_dltensor(t);
  return &storage;
}

TEST_P(BatchNormVsTorch, ForwardBackwardAndRunningStats) {
  const BnCase& c = GetParam();
  if (c.cuda && !at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto dev = at::TensorOptions().device(test_device(c.cuda));
  const int64_t channels = c.shape[1];
  const int train_steps = 3;
  // GPU reductions run in a different order from the CPU oracle's.
  const double tol = c.cuda ? 1e-4 : 1e-5;
  at::manual_seed(11);

  TensorScratch oracle;
  at::Tensor weight, bias;
  if (c.affine) {
    weight = at::randn({channels}) * 0.5 + 1.0;
    bias = at::randn({channels}) * 0.2;
    oracle.write("weight.bin", weight);
    oracle.write("bias.bin", bias);
    weight = weight.to(dev.device());
    bias = bias.to(dev.device());
  }
  std::vector<std::string> tags;
  for (int k = 0; k < train_steps; ++k) tags.push_back(std::to_string(k));
  tags.push_back("_eval");
  std::map<std::string, at::Tensor> x, gy;
  for (const auto& tag : tags) {
    x[tag] = at::randn(c.shape) * 2.0 + 0.5;
    gy[tag] = at::randn(c.shape);
    oracle.write("x" + tag + ".bin", x[tag]);
    oracle.write("gy" + tag + ".bin", gy[tag]);
  }
  std::ostringstream config;
  config << "{\"shape\": [";
  for (size_t d = 0; d < c.shape.size(); ++d) config << (d ? ", " : "") << c.shape[d];
  config << "], \"eps\": " << c.eps << ", \"momentum\": " << c.momentum
         << ", \"affine\": " << (c.affine ? "true" : "false")
         << ", \"track_running_stats\": " << (c.track ? "true" : "false")
         << ", \"train_steps\": " << train_steps << "}";
  oracle.write_text("config.json", config.str());
  oracle.run("batchnorm.py");

  const auto& vt = vtable_of<kiln_norm_vtable>("kiln_batchnorm", "batchnorm");
  Options options;
  options.set_float("momentum", c.momentum)
      .set_float("eps", c.eps)
      .set_bool("affine", c.affine)
      .set_bool("track_running_stats", c.track);
  const int32_t device_type = c.cuda ? kDLCUDA : kDLCPU;  // the device the layer runs on (1.9)
  kiln_norm_setup setup{sizeof(kiln_norm_setup), channels, KILN_ACT_NONE, 0, 0.0, device_type, 0};
  kiln_norm_layout layout{};
  layout.struct_size = sizeof(layout);
  void* instance = nullptr;
  ASSERT_KILN_OK(vt.create(fake_host(), options.get(), &setup, &layout, &instance));
  EXPECT_EQ(layout.affine, c.affine ? 1 : 0);
  EXPECT_EQ(layout.running_stats, c.track ? 1 : 0);
  EXPECT_EQ(layout.saves, KILN_NORM_SAVE_INPUT);
  EXPECT_EQ(layout.fused_activation, 0);

  // Host-owned tensors, initialised as the host does.
  at::Tensor running_mean, running_var;
  if (c.track) {
    running_mean = at::zeros({channels}, dev);
    running_var = at::ones({channels}, dev);
  }
  at::Tensor save_mean = at::empty({channels}, dev), save_invstd = at::empty({channels}, dev);

  for (const auto& tag : tags) {
    SCOPED_TRACE("step " + tag);
    const bool training = tag != "_eval";
    at::Tensor input = x[tag].to(dev.device()), output = at::empty_like(input);
    DLTensor in_dl = kiln::as_dltensor(input), out_dl = kiln::as_dltensor(output);
    DLTensor w_dl, b_dl, rm_dl, rv_dl, sm_dl, si_dl;
    kiln_norm_forward_args fwd{};
    fwd.struct_size = sizeof(fwd);
    fwd.training = training;
    fwd.input = &in_dl;
    fwd.output = &out_dl;
    fwd.weight = dl_or_null(weight, w_dl);
    fwd.bias = dl_or_null(bias, b_dl);
    fwd.running_mean = dl_or_null(running_mean, rm_dl);
    fwd.running_var = dl_or_null(running_var, rv_dl);
    fwd.save_mean = dl_or_null(save_mean, sm_dl);
    fwd.save_invstd = dl_or_null(save_invstd, si_dl);
    ASSERT_KILN_OK(vt.forward(instance, nullptr, &fwd));
    expect_close(output, oracle.read("y" + tag + ".bin", c.shape), tol, tol, "output");
    if (training) {
      expect_close(save_mean, oracle.read("save_mean" + tag + ".bin", {channels}), tol, tol,
                   "save_mean");
      expect_close(save_invstd, oracle.read("save_invstd" + tag + ".bin", {channels}), tol, tol,
                   "save_invstd");
    }

    at::Tensor grad_out = gy[tag].to(dev.device()), grad_in = at::empty_like(input);
    at::Tensor grad_w, grad_b;
    if (c.affine) {
      grad_w = at::empty({channels}, dev);
      grad_b = at::empty({channels}, dev);
    }
    DLTensor go_dl = kiln::as_dltensor(grad_out), gi_dl = kiln::as_dltensor(grad_in);
    DLTensor gw_dl, gb_dl;
    kiln_norm_backward_args bwd{};
    bwd.struct_size = sizeof(bwd);
    bwd.training = training;
    bwd.grad_output = &go_dl;
    bwd.saved = &in_dl;
    bwd.weight = fwd.weight;
    bwd.bias = fwd.bias;
    bwd.running_mean = fwd.running_mean;
    bwd.running_var = fwd.running_var;
    bwd.save_mean = fwd.save_mean;
    bwd.save_invstd = fwd.save_invstd;
    bwd.grad_input = &gi_dl;
    bwd.grad_weight = dl_or_null(grad_w, gw_dl);
    bwd.grad_bias = dl_or_null(grad_b, gb_dl);
    ASSERT_KILN_OK(vt.backward(instance, nullptr, &bwd));
    expect_close(grad_in, oracle.read("gx" + tag + ".bin", c.shape), tol, tol, "grad_input");
    if (c.affine) {
      expect_close(grad_w, oracle.read("gw" + tag + ".bin", {channels}), tol, tol, "grad_weight");
      expect_close(grad_b, oracle.read("gb" + tag + ".bin", {channels}), tol, tol, "grad_bias");
    }
    if (training && tag == std::to_string(train_steps - 1) && c.track) {
      expect_close(running_mean, oracle.read("running_mean.bin", {channels}), tol, tol,
                   "running_mean");
      expect_close(running_var, oracle.read("running_var.bin", {channels}), tol, tol,
                   "running_var");
    }
  }
  vt.destroy(instance);
}

std::vector<BnCase> bn_cases() {
  std::vector<BnCase> cases = {{"bn2d", {4, 3, 5, 6}, true, true, 0.1, 1e-5, false},
                               {"bn1d", {8, 5}, true, true, 0.1, 1e-5, false},
                               {"bn2d_plain", {4, 3, 5, 6}, false, false, 0.2, 1e-3, false},
                               {"bn2d_no_track", {6, 2, 3, 3}, true, false, 0.1, 1e-5, false}};
  for (size_t i = 0, n = cases.size(); i < n; ++i) {
    BnCase cuda = cases[i];
    cuda.name += "_cuda";
    cuda.cuda = true;
    cases.push_back(cuda);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, BatchNormVsTorch, ::testing::ValuesIn(bn_cases()),
                         [](const auto& info) { return info.param.name; });

// Half-precision inputs with float32 parameters and statistics (the fp32-norm policy) and
// all-half layers: the claimed F16/BF16 capabilities work and agree with a float32 run.
TEST(BatchNorm, HalfInputsMatchFloat) {
  const auto& vt = vtable_of<kiln_norm_vtable>("kiln_batchnorm", "batchnorm");
  Options options;
  options.set_float("momentum", 0.1)
      .set_float("eps", 1e-5)
      .set_bool("affine", true)
      .set_bool("track_running_stats", true);
  kiln_norm_setup setup{sizeof(kiln_norm_setup), 3, KILN_ACT_NONE, 0, 0.0, kDLCPU, 0};
  kiln_norm_layout layout{};
  layout.struct_size = sizeof(layout);
  void* instance = nullptr;
  ASSERT_KILN_OK(vt.create(fake_host(), options.get(), &setup, &layout, &instance));
  at::manual_seed(5);
  const at::Tensor x = at::randn({4, 3, 5, 5}), w = at::randn({3}) + 1.0, b = at::randn({3});
  // Output of one training forward with the given input and parameter dtypes, as float32.
  auto run = [&](at::ScalarType input_type, at::ScalarType param_type) {
    at::Tensor in = x.to(input_type), out = at::empty_like(in);
    at::Tensor wt = w.to(param_type), bt = b.to(param_type);
    at::Tensor rm = at::zeros({3}, param_type), rv = at::ones({3}, param_type);
    at::Tensor sm = at::empty({3}), si = at::empty({3});
    DLTensor d[8] = {kiln::as_dltensor(in), kiln::as_dltensor(out), kiln::as_dltensor(wt),
                     kiln::as_dltensor(bt), kiln::as_dltensor(rm),  kiln::as_dltensor(rv),
                     kiln::as_dltensor(sm), kiln::as_dltensor(si)};
    kiln_norm_forward_args fwd{sizeof(fwd), 1,     0,     &d[0], &d[1],   &d[2],   &d[3],
                               &d[4],       &d[5], &d[6], &d[7], nullptr, nullptr, nullptr};
    EXPECT_KILN_OK(vt.forward(instance, nullptr, &fwd));
    return out.to(at::kFloat);
  };
  const at::Tensor reference = run(at::kFloat, at::kFloat);
  for (at::ScalarType type : {at::kHalf, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(type));
    expect_close(run(type, at::kFloat), reference, 2e-2, 2e-2, "half input, float params");
    expect_close(run(type, type), reference, 2e-2, 2e-2, "all half");
  }
  vt.destroy(instance);
}

TEST(BatchNorm, RefusesNonPositiveEps) {
  const auto& vt = vtable_of<kiln_norm_vtable>("kiln_batchnorm", "batchnorm");
  Options options;
  options.set_float("momentum", 0.1).set_float("eps", 0.0);
  kiln_norm_setup setup{sizeof(kiln_norm_setup), 4, KILN_ACT_NONE, 0, 0.0, kDLCPU, 0};
  kiln_norm_layout layout{};
  layout.struct_size = sizeof(layout);
  void* instance = nullptr;
  Status status = take(vt.create(fake_host(), options.get(), &setup, &layout, &instance));
  ASSERT_NE(status, nullptr);
  EXPECT_EQ(status->code, KILN_ERR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace kiln::test
