// The vit model plugin through its C ABI, checked against a plain-torch ViT (tests/oracle/vit.py).
#include <ATen/Functions.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cpu_bf16_autocast.hpp"
#include "model_checks.hpp"
#include "model_plugin.hpp"
#include "tensor_scratch.hpp"

namespace kiln_test {
namespace {

using kiln::test::closeness;
using kiln::test::TensorScratch;

const ModelPlugin& vit() { return ModelPlugin::get("libkiln_vit.so"); }

// A small ViT: dim 32, depth 2, heads 4 (head_dim 8), mlp width 64, patch 4.
OptionSet small() {
  OptionSet options;
  options.set_int("dim", 32).set_int("depth", 2).set_int("heads", 4);
  return options;
}

std::shared_ptr<kiln::Model> build(OptionSet options, int64_t c, int64_t h, int64_t w,
                                   int64_t classes = 10) {
  Created created = vit().create(options, c, h, w, classes);
  if (created.status) throw std::runtime_error("create failed: " + created.status->message);
  return created.model;
}

// The refusal of `options` for c×h×w images: its message, after checking the code.
std::string refusal(OptionSet options, int64_t c = 1, int64_t h = 28, int64_t w = 28) {
  Created created = vit().create(options, c, h, w, 10);
  EXPECT_EQ(created.model, nullptr);
  if (!created.status) return "(accepted)";
  EXPECT_EQ(created.status->code, KILN_ERR_INVALID_ARGUMENT) << created.status->message;
  return created.status->message;
}

// The names of the modules that are kiln::NormLayers (what the host's group rules see).
std::set<std::string> norm_layer_names(kiln::Model& model) {
  std::set<std::string> names;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (dynamic_cast<kiln::NormLayer*>(item.value().get()) != nullptr) names.insert(item.key());
  }
  return names;
}

// The closed-form parameter count of a ViT with `tokens` patches.
int64_t vit_parameters(int64_t c, int64_t patch, int64_t dim, int64_t depth, int64_t hidden,
                       int64_t tokens, bool cls, int64_t classes) {
  const int64_t block = 2 * dim                    // norm1
                        + 3 * dim * dim + 3 * dim  // attn.qkv
                        + dim * dim + dim          // attn.proj
                        + 2 * dim                  // norm2
                        + dim * hidden + hidden    // mlp.fc1
                        + hidden * dim + dim;      // mlp.fc2
  return c * patch * patch * dim + dim             // patch_embed.proj
         + (cls ? dim : 0)                         // cls_token
         + (tokens + (cls ? 1 : 0)) * dim          // pos_embed
         + depth * block + 2 * dim                 // blocks, norm
         + dim * classes + classes;                // head
}

TEST(VitTest, SchemaNamesTheDocumentedOptions) {
  const kiln_component_descriptor* c = vit().descriptor()->components[0];
  EXPECT_STREQ(c->name, "vit");
  EXPECT_EQ(c->kind, KILN_COMPONENT_MODEL);
  std::string joined;
  for (size_t i = 0; i < c->option_count; ++i) {
    joined += std::string(c->options[i].name) + "=" + c->options[i].default_value + " ";
    EXPECT_NE(c->options[i].doc, nullptr);
  }
  EXPECT_EQ(joined, "patch_size=4 dim=128 depth=6 heads=4 mlp_ratio=2.0 pool=\"cls\" dropout=0.0 ");
  const uint64_t flags = c->capabilities->flags;
  for (uint64_t flag : {KILN_CAP_DEVICE_CPU, KILN_CAP_DEVICE_CUDA, KILN_CAP_DTYPE_F32,
                        KILN_CAP_DTYPE_F16, KILN_CAP_DTYPE_BF16, KILN_CAP_DTYPE_F64}) {
    EXPECT_TRUE(flags & flag) << flag;
  }
  EXPECT_EQ(vit().descriptor()->torch_cxx11_abi, KILN_TORCH_CXX11_ABI);
}

TEST(VitTest, RefusesBadOptionsWithClearMessages) {
  std::string m = refusal(OptionSet().set_int("patch_size", 5));
  EXPECT_NE(m.find("vit: patch_size 5 must divide the image size 28x28"), std::string::npos) << m;
  m = refusal(OptionSet().set_int("patch_size", 4), 3, 32, 30);
  EXPECT_NE(m.find("32x30"), std::string::npos) << m;
  m = refusal(OptionSet().set_int("dim", 30).set_int("heads", 4));
  EXPECT_NE(m.find("vit: dim 30 must be divisible by heads 4"), std::string::npos) << m;
  m = refusal(OptionSet().set_string("pool", "max"));
  EXPECT_NE(m.find("vit: pool must be cls or mean, not 'max'"), std::string::npos) << m;
  m = refusal(OptionSet().set_float("dropout", 1.0));
  EXPECT_NE(m.find("vit: dropout"), std::string::npos) << m;
  m = refusal(OptionSet().set_float("dropout", -0.1));
  EXPECT_NE(m.find("vit: dropout"), std::string::npos) << m;
  m = refusal(OptionSet().set_float("mlp_ratio", 0.001));
  EXPECT_NE(m.find("vit: mlp_ratio"), std::string::npos) << m;
  m = refusal(OptionSet().set_float("mlp_ratio", std::nan("")));
  EXPECT_NE(m.find("vit: mlp_ratio"), std::string::npos) << m;
  for (const char* name : {"patch_size", "dim", "depth", "heads"}) {
    m = refusal(OptionSet().set_int(name, 0));
    EXPECT_EQ(m.rfind(std::string("vit: ") + name, 0), 0u) << m;
  }
  m = refusal(OptionSet().set_int("dim", int64_t{1} << 40).set_int("heads", 1));
  EXPECT_NE(m.find("vit: dim must be in"), std::string::npos) << m;
  m = refusal(OptionSet().set_int("pool", 1));
  EXPECT_NE(m.find("vit: option 'pool' has the wrong type"), std::string::npos) << m;
  // The same sizes are accepted where they fit: 32x30 with patch 2, dim 30 with 3 heads.
  OptionSet fits = OptionSet().set_int("patch_size", 2).set_int("dim", 30).set_int("heads", 3);
  EXPECT_EQ(vit().create(fits, 3, 32, 30, 10).status, nullptr);
}

TEST(VitTest, ShapesAndTimmParameterNames) {
  auto model = build(small(), 1, 28, 28);
  std::set<std::string> expected{"patch_embed.proj.weight",
                                 "patch_embed.proj.bias",
                                 "cls_token",
                                 "pos_embed",
                                 "norm.weight",
                                 "norm.bias",
                                 "head.weight",
                                 "head.bias"};
  for (const std::string b : {"blocks.0.", "blocks.1."}) {
    for (const char* leaf : {"norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"}) {
      expected.insert(b + leaf + ".weight");
      expected.insert(b + leaf + ".bias");
    }
  }
  EXPECT_EQ(parameter_names(*model), expected);
  EXPECT_EQ(model->block_names(), (std::vector<std::string>{"blocks.0", "blocks.1"}));
  EXPECT_EQ(parameter(*model, "patch_embed.proj.weight").sizes(), at::IntArrayRef({32, 1, 4, 4}));
  EXPECT_EQ(parameter(*model, "cls_token").sizes(), at::IntArrayRef({1, 1, 32}));
  EXPECT_EQ(parameter(*model, "pos_embed").sizes(), at::IntArrayRef({1, 50, 32}));
  EXPECT_EQ(parameter(*model, "blocks.1.attn.qkv.weight").sizes(), at::IntArrayRef({96, 32}));
  EXPECT_EQ(parameter(*model, "blocks.1.mlp.fc1.weight").sizes(), at::IntArrayRef({64, 32}));
  EXPECT_EQ(parameter(*model, "blocks.1.mlp.fc2.weight").sizes(), at::IntArrayRef({32, 64}));
  EXPECT_EQ(parameter(*model, "head.weight").sizes(), at::IntArrayRef({10, 32}));
  EXPECT_EQ(parameter_count(*model), vit_parameters(1, 4, 32, 2, 64, 49, true, 10));
  EXPECT_EQ(model->forward(at::randn({3, 1, 28, 28})).sizes(), at::IntArrayRef({3, 10}));
  EXPECT_EQ(norm_layer_names(*model),
            (std::set<std::string>{"blocks.0.norm1", "blocks.0.norm2", "blocks.1.norm1",
                                   "blocks.1.norm2", "norm"}));
}

TEST(VitTest, MeanPoolHasNoClassToken) {
  auto model =
      build(small().set_string("pool", "mean").set_int("patch_size", 8).set_float("mlp_ratio", 1.5),
            3, 32, 32, 7);
  EXPECT_EQ(parameter_names(*model).count("cls_token"), 0u);
  EXPECT_EQ(parameter(*model, "pos_embed").sizes(), at::IntArrayRef({1, 16, 32}));
  EXPECT_EQ(parameter(*model, "blocks.0.mlp.fc1.weight").sizes(), at::IntArrayRef({48, 32}));
  EXPECT_EQ(parameter_count(*model), vit_parameters(3, 8, 32, 2, 48, 16, false, 7));
  EXPECT_EQ(model->forward(at::randn({2, 3, 32, 32})).sizes(), at::IntArrayRef({2, 7}));
}

TEST(VitTest, DefaultsBuildTheDocumentedModel) {
  auto model = build(OptionSet(), 1, 28, 28);
  EXPECT_EQ(model->block_names().size(), 6u);
  EXPECT_EQ(parameter_count(*model), vit_parameters(1, 4, 128, 6, 256, 49, true, 10));
}

TEST(VitTest, InitialisesLikeTimm) {
  at::manual_seed(0);
  auto model = build(OptionSet().set_int("dim", 64).set_int("depth", 1), 1, 28, 28);
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& p = item.value();
    const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (name.find("norm") != std::string::npos) {
      // LayerNorm: weight 1, bias 0.
      EXPECT_TRUE(at::equal(p, bias ? at::zeros_like(p) : at::ones_like(p))) << name;
    } else if (name.rfind("patch_embed", 0) == 0) {
      // torch.nn.Conv2d's default: U(±1/√fan_in) for weight and bias alike.
      const double bound = 1.0 / std::sqrt(16.0);
      EXPECT_LE(p.abs().max().item<double>(), bound) << name;
      EXPECT_GT(p.abs().max().item<double>(), bound * std::pow(1e-9, 1.0 / p.numel())) << name;
    } else if (bias) {
      EXPECT_TRUE(at::equal(p, at::zeros_like(p))) << name;
    } else {
      // trunc_normal(std .02): the sample mean and std within 5 standard errors of 0 and .02
      // (σ/√n and about σ/√(2n)).
      const double n = static_cast<double>(p.numel());
      EXPECT_NEAR(p.mean().item<double>(), 0.0, 5 * 0.02 / std::sqrt(n)) << name;
      EXPECT_NEAR(p.std().item<double>(), 0.02, 5 * 0.02 / std::sqrt(2 * n)) << name;
    }
  }
}

TEST(VitTest, BackwardReachesEveryParameter) {
  auto model = build(small().set_float("dropout", 0.1), 3, 32, 32);
  expect_trains(*model, 4, 3, 32, 32, 10);
}

TEST(VitTest, DropoutOnlyWhileTraining) {
  auto model = build(small().set_float("dropout", 0.5), 1, 28, 28);
  at::Tensor x = at::randn({4, 1, 28, 28});
  EXPECT_FALSE(at::equal(model->forward(x), model->forward(x)));
  model->eval();
  EXPECT_TRUE(at::equal(model->forward(x), model->forward(x)));
}

struct OracleCase {
  int64_t channels, height, width, patch;
  const char* pool;
};

TEST(VitTest, MatchesTorchOracleInFp32AndBf16Autocast) {
  const std::vector<OracleCase> cases{{1, 28, 28, 4, "cls"}, {3, 32, 32, 4, "mean"}};
  const int64_t batch = 4, classes = 10;
  TensorScratch oracle;
  std::vector<at::Tensor> fp32, bf16;
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> grads;  // per case, by name
  std::ostringstream config;
  config << "{\"depth\": 2, \"heads\": 4, \"cases\": [";
  at::manual_seed(11);
  for (size_t i = 0; i < cases.size(); ++i) {
    const OracleCase& c = cases[i];
    const std::string prefix = "c" + std::to_string(i) + "_";
    auto model = build(small().set_int("patch_size", c.patch).set_string("pool", c.pool),
                       c.channels, c.height, c.width, classes);
    model->eval();
    // Random biases and norm affines, so zero or unit initial values cannot hide a wiring
    // mistake.
    {
      at::NoGradGuard no_grad;
      for (auto& item : model->named_parameters()) item.value().normal_(0.0, 0.2);
    }
    at::Tensor images = at::randn({batch, c.channels, c.height, c.width});
    oracle.write(prefix + "images.bin", images);
    config << (i ? ", " : "") << "{\"prefix\": \"" << prefix << "\", \"shape\": [" << batch << ", "
           << c.channels << ", " << c.height << ", " << c.width << "], \"patch\": " << c.patch
           << ", \"pool\": \"" << c.pool
           << "\", \"params\": " << write_parameters(oracle, *model, prefix) << "}";
    fp32.push_back(model->forward(images));
    // The backward too: its route through the attention heads is the plugin's own
    // (split_heads.hpp), not autograd's.
    at::Tensor upstream = at::randn({batch, classes});
    oracle.write(prefix + "upstream.bin", upstream);
    (fp32.back() * upstream).sum().backward();
    grads.emplace_back();
    for (const auto& item : model->named_parameters()) {
      grads.back().emplace_back(item.key(), item.value().grad());
    }
    {
      CpuBf16Autocast autocast;
      bf16.push_back(model->forward(images));
    }
    EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
    EXPECT_EQ(bf16.back().scalar_type(), at::kBFloat16);
  }
  config << "]}";
  oracle.write_text("config.json", config.str());
  oracle.run("vit.py");

  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string prefix = "c" + std::to_string(i) + "_";
    at::Tensor want32 = oracle.read(prefix + "logits_fp32.bin", {batch, classes});
    at::Tensor want16 = oracle.read(prefix + "logits_bf16.bin", {batch, classes});
    // fp32: the same ATen kernels on the same values; the margin covers kernel choices that
    // depend on memory layout (reduction order in layer_norm, gemm blocking).
    EXPECT_LE(closeness(fp32[i], want32, 1e-4, 1e-5), 1.0) << prefix;
    // bf16 autocast: the same casts and ATen ops run on both sides, and the logits come out
    // bitwise equal here; the margin allows one bf16 rounding step (2^-8 relative) should a
    // kernel choose another reduction order.
    EXPECT_LE(closeness(bf16[i], want16, 4e-3, 1e-3), 1.0) << prefix;
    // Autocast does change the result (by about 3e-3 here), so the two oracle outputs are
    // different computations and the check above is not the fp32 one again.
    EXPECT_FALSE(at::equal(bf16[i].to(at::kFloat), want32)) << prefix;
    EXPECT_LE(closeness(bf16[i], want32, 0.05, 0.05), 1.0) << prefix;
    // fp32 gradients: the same ATen kernels but for the split into heads, whose backward only
    // copies; the margin is the logits' (reduction order in layer_norm's and gemm's backward).
    for (const auto& [name, grad] : grads[i]) {
      ASSERT_TRUE(grad.defined()) << prefix << name;
      at::Tensor want = oracle.read(prefix + "grad." + name + ".bin", grad.sizes().vec());
      EXPECT_LE(closeness(grad, want, 1e-4, 1e-5), 1.0) << prefix << name;
    }
  }
}

// Plain SGD (lr 0.1) on one fixed batch of 16×16 images; the losses before each step.
std::vector<double> sgd_losses(int64_t steps) {
  at::manual_seed(5);
  auto model = build(small(), 1, 16, 16);
  at::Tensor images = at::randn({8, 1, 16, 16});
  at::Tensor labels = at::randint(10, {8}, at::kLong);
  std::vector<double> losses;
  for (int64_t s = 0; s < steps; ++s) {
    model->zero_grad();
    at::Tensor loss = at::cross_entropy_loss(model->forward(images), labels);
    loss.backward();
    losses.push_back(loss.item<double>());
    at::NoGradGuard no_grad;
    for (at::Tensor& p : model->parameters()) p.sub_(p.grad(), 0.1);
  }
  return losses;
}

TEST(VitTest, SgdStepsReduceTheLossDeterministically) {
  const std::vector<double> losses = sgd_losses(8);
  for (size_t i = 1; i < losses.size(); ++i) EXPECT_LT(losses[i], losses[i - 1]) << "step " << i;
  // From ln 10 ≈ 2.3 to about 1.6 (torch, same recipe); 0.8× leaves room for the draws.
  EXPECT_LT(losses.back(), 0.8 * losses.front())
      << "first " << losses.front() << " last " << losses.back();
  EXPECT_EQ(sgd_losses(8), losses);
}

// Forward and backward of `model` on `dtype` images: finite logits of that dtype and a finite
// gradient on every parameter.
void expect_finite_step(kiln::Model& model, at::ScalarType dtype) {
  at::Tensor images = at::randn({4, 1, 28, 28}).to(dtype);
  at::Tensor labels = at::randint(10, {4}, at::kLong);
  at::Tensor logits = model.forward(images);
  EXPECT_EQ(logits.scalar_type(), dtype);
  EXPECT_TRUE(at::isfinite(logits).all().item<bool>());
  at::cross_entropy_loss(logits.to(at::kFloat), labels).backward();
  for (const auto& item : model.named_parameters()) {
    const at::Tensor& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << item.key();
    EXPECT_EQ(grad.scalar_type(), item.value().scalar_type()) << item.key();
    EXPECT_TRUE(at::isfinite(grad).all().item<bool>()) << item.key();
  }
}

TEST(VitTest, RunsCastToEveryAdvertisedDtype) {
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kDouble}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::manual_seed(2);
    auto model = build(small(), 1, 28, 28);
    model->to(dtype);
    expect_finite_step(*model, dtype);
  }
}

TEST(VitTest, RunsWithNormLayersKeptFloat32) {
  // apex O2: everything bfloat16 but the norm layers, which stay float32.
  at::manual_seed(3);
  auto reference = build(small(), 1, 28, 28);
  at::manual_seed(3);
  auto model = build(small(), 1, 28, 28);
  model->to(at::kBFloat16);
  for (const auto& item : model->named_modules("", /*include_self=*/false)) {
    if (dynamic_cast<kiln::NormLayer*>(item.value().get()) != nullptr) {
      item.value()->to(at::kFloat);
    }
  }
  EXPECT_EQ(parameter(*model, "blocks.0.norm1.weight").scalar_type(), at::kFloat);
  EXPECT_EQ(parameter(*model, "norm.bias").scalar_type(), at::kFloat);
  EXPECT_EQ(parameter(*model, "blocks.0.attn.qkv.weight").scalar_type(), at::kBFloat16);
  at::manual_seed(4);
  expect_finite_step(*model, at::kBFloat16);
  // Same weights (same seed), so the O2 logits are the float32 ones up to bf16 rounding.
  at::Tensor images = at::randn({4, 1, 28, 28});
  EXPECT_LE(
      closeness(model->forward(images.to(at::kBFloat16)), reference->forward(images), 0.1, 0.05),
      1.0);
}

}  // namespace
}  // namespace kiln_test
