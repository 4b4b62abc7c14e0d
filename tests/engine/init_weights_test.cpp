// model.init with torchvision's and timm's own weights (tests/oracle/pretrained.py): Kiln's resnet
// and vit, built as a run builds them (the batchnorm plugin behind every norm layer) and given the
// Python model's state_dict, compute its logits in eval and in train mode and update the running
// statistics as it does; the deep ResNets have its names and shapes. Then load_weights' own
// rules: model.init_skip, a new head, missing tensors, num_batches_tracked.
#include "engine/init_weights.hpp"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "config/pipeline.hpp"
#include "engine/model_build.hpp"
#include "io/safetensors.hpp"
#include "kiln/torch.hpp"
#include "kiln_test_paths.h"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "tensor_scratch.hpp"

namespace {

namespace engine = kiln::engine;

const kiln::plugin::Registry& registry() {
  static kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
  static const kiln::plugin::Registry r = [] {
    std::vector<std::string> refused;
    return kiln::plugin::load_all(loader, {KILN_PLUGIN_DIR}, refused);
  }();
  return r;
}

// The model a `[model]` section (and the default batchnorm) builds for c×hw×hw images. A
// ResNet's batch norm runs ATen's kernels (norm.fused = false), bit for bit torchvision's: this
// test is about the model's names, layout and weights. Kiln's fused kernels have their own oracle
// (fused_bn_test); over ResNet-50's 53 train-mode layers with random statistics their rounding,
// another summation order than ATen's, grows to ~4e-5 of the logits.
std::shared_ptr<kiln::Model> build(const std::string& model_section, int64_t c, int64_t hw,
                                   int64_t classes) {
  const bool resnet = model_section.find("\"resnet\"") != std::string::npos;
  const kiln::config::Pipeline p = kiln::config::load_pipeline_text(
      "[model]\n" + model_section + (resnet ? "[norm]\nfused = false\n" : ""), "init_weights.toml",
      {}, registry());
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  input.channels = c;
  input.height = hw;
  input.width = hw;
  input.num_classes = classes;
  return engine::build_model(p, input, c10::kCPU);
}

std::map<std::string, at::Tensor> tensors_of(kiln::Model& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = item.value();
  for (const auto& item : model.named_buffers()) out[item.key()] = item.value();
  return out;
}

struct Case {
  std::string name;     // torchvision model name, or "vit"
  std::string section;  // Kiln's [model] keys for it
  std::string timm;     // VisionTransformer's keyword arguments as JSON (vit only)
  bool full;            // logits and running statistics; else names and shapes only
  int64_t hw = 0;       // image side; 0: 64, or 32 for vit
};

constexpr int64_t kBatch = 2, kClasses = 10;

int64_t side(const Case& c) { return c.hw != 0 ? c.hw : c.name == "vit" ? 32 : 64; }

std::string config_json(const std::vector<Case>& cases) {
  std::ostringstream json;
  json << "{\"cases\": [";
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    json << (i ? ", " : "") << "{\"name\": \"" << c.name << "\", \"prefix\": \"c" << i
         << "_\", \"kind\": \"" << (c.full ? "full" : "names") << "\", \"seed\": " << 100 + i
         << ", \"classes\": " << kClasses << ", \"input\": [" << kBatch << ", 3, " << side(c)
         << ", " << side(c) << "]" << (c.timm.empty() ? "" : ", \"timm\": " + c.timm) << "}";
  }
  json << "]}";
  return json.str();
}

// Max |a - e| over max |e|: the logits' error relative to their scale.
double relative_error(const at::Tensor& actual, const at::Tensor& expected) {
  return (actual - expected).abs().max().item<double>() / expected.abs().max().item<double>();
}

// float32 through the same ops in another order (cuDNN-free CPU kernels on both sides): the
// logits agree to 1e-5 of their largest magnitude; running statistics to 1e-5 relative.
constexpr double kLogitTol = 1e-5;

void check_full(const Case& c, const std::string& prefix, const kiln::test::TensorScratch& s) {
  SCOPED_TRACE(c.name);
  const int64_t hw = side(c);
  auto model = build(c.section, 3, hw, kClasses);
  const engine::InitSummary summary =
      engine::load_weights(*model, s.path(prefix + "weights.safetensors"));
  EXPECT_TRUE(summary.kept.empty());
  EXPECT_TRUE(summary.unused.empty()) << summary.unused.front();
  at::NoGradGuard no_grad;
  const at::Tensor x = s.read(prefix + "x.bin", {kBatch, 3, hw, hw});
  model->eval();
  const at::Tensor eval = model->forward(x);
  model->train();
  const at::Tensor train = model->forward(x);
  const at::Tensor eval_expected = s.read(prefix + "eval.bin", {kBatch, kClasses});
  const at::Tensor train_expected = s.read(prefix + "train.bin", {kBatch, kClasses});
  const double eval_err = relative_error(eval, eval_expected);
  const double train_err = relative_error(train, train_expected);
  std::cout << c.name << ": eval max|diff| " << (eval - eval_expected).abs().max().item<double>()
            << " (" << eval_err << " of max|logit| " << eval_expected.abs().max().item<double>()
            << "), train max|diff| " << (train - train_expected).abs().max().item<double>() << " ("
            << train_err << " of max|logit| " << train_expected.abs().max().item<double>() << ")\n";
  EXPECT_LE(eval_err, kLogitTol);
  EXPECT_LE(train_err, kLogitTol);
  if (c.name == "vit") return;  // no buffers
  // The running statistics after the train-mode forward (momentum 0.1, unbiased variance).
  const kiln::io::SafetensorsFile after =
      kiln::io::read_safetensors(s.path(prefix + "after.safetensors"));
  int64_t stats = 0;
  for (const auto& item : model->named_buffers()) {
    const at::Tensor* expected = after.find(item.key());
    ASSERT_NE(expected, nullptr) << item.key();
    EXPECT_LE(kiln::test::closeness(item.value(), *expected, 1e-5, 1e-6), 1.0) << item.key();
    ++stats;
  }
  EXPECT_GT(stats, 0);
  EXPECT_EQ(summary.batch_counters * 2, stats);  // running_mean and running_var per norm
}

// Every state_dict tensor but the counters is the model's, with its shape, and nothing else.
void check_names(const Case& c, const std::string& prefix, const kiln::test::TensorScratch& s) {
  SCOPED_TRACE(c.name);
  auto model = build(c.section, 3, side(c), kClasses);
  std::map<std::string, std::vector<int64_t>> expected;
  std::istringstream lines(s.read_text(prefix + "names.txt"));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    if (name.find("num_batches_tracked") != std::string::npos) continue;
    std::vector<int64_t>& shape = expected[name];
    for (int64_t d = 0; fields >> d;) shape.push_back(d);
  }
  std::map<std::string, std::vector<int64_t>> got;
  for (const auto& [name, t] : tensors_of(*model)) got[name] = t.sizes().vec();
  EXPECT_EQ(got.size(), expected.size());
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(got.count(name)) << "Kiln's model has no " << name;
    EXPECT_EQ(got[name], shape) << name;
  }
}

TEST(InitWeights, TorchvisionAndTimmModelsGiveTheirLogits) {
  const std::string vit =
      "name = \"vit\"\npatch_size = 8\ndim = 64\ndepth = 2\nheads = 4\n"
      "mlp_ratio = 2.0\n";
  const std::string timm =
      "\"img_size\": 32, \"patch_size\": 8, \"embed_dim\": 64, \"depth\": 2, "
      "\"num_heads\": 4, \"mlp_ratio\": 2.0";
  const std::vector<Case> cases{
      {"resnet18", "name = \"resnet\"\ndepth = \"18\"\n", "", true},
      // torchvision's stem on 32-pixel images, asked for: its weights load and compute as there.
      {"resnet18", "name = \"resnet\"\ndepth = \"18\"\nstem = \"imagenet\"\n", "", true, 32},
      {"resnet34", "name = \"resnet\"\ndepth = \"34\"\n", "", true},
      {"resnet50", "name = \"resnet\"\ndepth = \"50\"\n", "", true},
      {"resnet101", "name = \"resnet\"\ndepth = \"101\"\n", "", false},
      {"resnet152", "name = \"resnet\"\ndepth = \"152\"\n", "", false},
      // timm's default: the class token, global_pool "token", the final norm before the head.
      {"vit", vit + "pool = \"cls\"\n", "{" + timm + "}", true},
      // pool mean is timm's global_pool "avg" with the final norm before pooling (fc_norm=False;
      // timm's default for avg, fc_norm after the pooling, is not Kiln's).
      {"vit", vit + "pool = \"mean\"\n",
       "{" + timm + ", \"class_token\": false, \"global_pool\": \"avg\", \"fc_norm\": false}",
       true},
  };
  kiln::test::TensorScratch s;
  s.write_text("config.json", config_json(cases));
  s.run("pretrained.py");
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string prefix = "c" + std::to_string(i) + "_";
    if (cases[i].full) {
      check_full(cases[i], prefix, s);
    } else {
      check_names(cases[i], prefix, s);
    }
  }
}

// ---- load_weights' rules, on the small ResNet -----------------------------------------------

const char* const kSmall = "name = \"resnet\"\nwidth = 8\nblocks = [1, 1]\n";

std::shared_ptr<kiln::Model> small() { return build(kSmall, 3, 16, kClasses); }

// `model`'s tensors as a file, with `edit` applied to the list first.
std::string write_file(const kiln::test::TensorScratch& s, const std::string& name,
                       kiln::Model& model,
                       const std::function<void(std::map<std::string, at::Tensor>&)>& edit = {}) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [n, t] : tensors_of(model)) tensors[n] = t.detach().clone();
  if (edit) edit(tensors);
  kiln::io::write_safetensors(s.path(name), {tensors.begin(), tensors.end()});
  return s.path(name);
}

std::string error_of(kiln::Model& model, const std::string& path,
                     const std::vector<std::string>& skip = {}) {
  try {
    engine::load_weights(model, path, skip);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(InitWeights, CountsTorchsBatchCountersAndListsUnusedTensors) {
  kiln::test::TensorScratch s;
  at::manual_seed(1);
  auto source = small();
  const std::string path = write_file(s, "a.safetensors", *source, [](auto& t) {
    for (const char* bn : {"bn1", "layer1.0.bn1", "layer2.0.downsample.1"}) {
      t[std::string(bn) + ".num_batches_tracked"] = at::scalar_tensor(5, at::kLong);
    }
    t["extra.weight"] = at::ones({2});
  });
  auto model = small();
  const engine::InitSummary summary = engine::load_weights(*model, path);
  EXPECT_EQ(summary.loaded.size(), tensors_of(*model).size());
  EXPECT_EQ(summary.batch_counters, 3);
  EXPECT_EQ(summary.unused, std::vector<std::string>{"extra.weight"});
  for (const auto& [name, t] : tensors_of(*model)) {
    EXPECT_TRUE(at::equal(t, tensors_of(*source).at(name))) << name;
  }
}

TEST(InitWeights, ANewHeadNeedsInitSkipAndThenKeepsTheModelsOwn) {
  kiln::test::TensorScratch s;
  auto source = small();
  const std::string path = write_file(s, "h.safetensors", *source, [](auto& t) {
    t["fc.weight"] = at::randn({1000, 16});
    t["fc.bias"] = at::randn({1000});
  });
  auto model = small();
  const at::Tensor fc_before = tensors_of(*model).at("fc.weight").clone();
  const at::Tensor conv_before = tensors_of(*model).at("conv1.weight").clone();
  EXPECT_EQ(error_of(*model, path),
            path +
                ": fc.weight has 1000x16 in the file, the model's is 10x16 (and 1 more: fc.bias): "
                "a new head or another input? To leave these at the model's initialisation, add "
                "model.init_skip = [\"^fc\\\\.\"]");
  // Nothing was copied before the refusal.
  EXPECT_TRUE(at::equal(tensors_of(*model).at("conv1.weight"), conv_before));

  const engine::InitSummary summary = engine::load_weights(*model, path, {"^fc\\."});
  EXPECT_EQ(summary.kept, (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_EQ(summary.file_skips.size(), 2u);
  EXPECT_TRUE(summary.unused.empty());
  EXPECT_TRUE(at::equal(tensors_of(*model).at("fc.weight"), fc_before));
  EXPECT_TRUE(
      at::equal(tensors_of(*model).at("conv1.weight"), tensors_of(*source).at("conv1.weight")));
}

TEST(InitWeights, MissingTensorsAreNamedWithThePatternThatSkipsThem) {
  kiln::test::TensorScratch s;
  auto model = small();
  const std::string path = write_file(s, "m.safetensors", *model, [](auto& t) {
    t.erase("layer2.0.conv1.weight");
    t.erase("layer2.0.bn1.running_var");
  });
  EXPECT_EQ(error_of(*model, path),
            path +
                ": no weights for 2 of the model's tensors: layer2.0.conv1.weight, "
                "layer2.0.bn1.running_var. To leave them at the model's initialisation, add "
                "model.init_skip = [\"^layer2\\\\.0\\\\.conv1\\\\.\", "
                "\"^layer2\\\\.0\\\\.bn1\\\\.\"]");
  // A pattern covers them; tensors the pattern matches that the file has are not read either.
  const engine::InitSummary summary = engine::load_weights(*model, path, {"^layer2\\.0\\."});
  EXPECT_EQ(summary.kept.size() + summary.loaded.size(), tensors_of(*model).size());
  EXPECT_GT(summary.file_skips.size(), 0u);
  EXPECT_EQ(engine::skip_pattern_for("blocks.0.attn.qkv.weight"),
            "^blocks\\\\.0\\\\.attn\\\\.qkv\\\\.");
  EXPECT_EQ(engine::skip_pattern_for("pos_embed"), "^pos_embed$");
}

}  // namespace
