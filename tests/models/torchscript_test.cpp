// The torchscript model plugin through its C ABI, on modules written and saved by
// tests/oracle/torchscript_train.py (conv -> BatchNorm2d -> relu -> pool -> linear, times a plain
// buffer): the state_dict's names, one set of tensors shared with the scripted module (the
// host's set_data casts and in-place updates reach its forward), train/eval reaching its batch
// norm, that batch norm a kiln::NormLayer to the host, gradients on every parameter, and the
// refusals, each naming the option `path` and the file.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "model_checks.hpp"
#include "model_plugin.hpp"
#include "scratch.hpp"

namespace kiln_test {
namespace {

constexpr int64_t kSize = 12;

const ModelPlugin& torchscript() { return ModelPlugin::get("libkiln_torchscript.so"); }

// The files of the oracle's "prepare" phase, written once for the whole test program.
const kiln::test::Scratch& files() {
  static const kiln::test::Scratch* scratch = [] {
    auto* s = new kiln::test::Scratch();
    s->write_text("config.json", R"({"phase": "prepare", "seed": 3, "train": 32, "test": 16, )"
                                 R"("size": 12})");
    s->run("torchscript_train.py");
    return s;
  }();
  return *scratch;
}

Created create(const std::string& file, int64_t channels = 1, int64_t classes = 10) {
  OptionSet options;
  options.set_string("path", file.empty() ? "" : files().path(file));
  return torchscript().create(options, channels, kSize, kSize, classes);
}

std::shared_ptr<kiln::Model> build(const std::string& file) {
  Created created = create(file);
  if (created.status) throw std::runtime_error("create failed: " + created.status->message);
  return created.model;
}

at::Tensor buffer(const kiln::Model& model, const std::string& name) {
  const auto buffers = model.named_buffers();
  const at::Tensor* b = buffers.find(name);
  if (b == nullptr) throw std::runtime_error("no buffer " + name);
  return *b;
}

TEST(TorchscriptTest, NamesAreThePythonModulesStateDict) {
  for (const char* file : {"net.pt", "traced.pt"}) {
    auto model = build(file);
    EXPECT_EQ(parameter_names(*model),
              (std::set<std::string>{"features.0.weight", "features.0.bias", "features.1.weight",
                                     "features.1.bias", "head.weight", "head.bias"}))
        << file;
    std::set<std::string> buffers;
    for (const auto& item : model->named_buffers()) buffers.insert(item.key());
    EXPECT_EQ(buffers, (std::set<std::string>{"features.1.running_mean", "features.1.running_var",
                                              "features.1.num_batches_tracked", "scale"}))
        << file;
    EXPECT_TRUE(model->block_names().empty());  // nothing for activation checkpointing
    expect_trains(*model, 4, 1, kSize, kSize, 10);
  }
}

TEST(TorchscriptTest, TheHostsCastsAndUpdatesReachTheScriptedForward) {
  auto model = build("net.pt");
  model->train(false);
  at::manual_seed(1);
  const at::Tensor x = at::randn({3, 1, kSize, kSize});
  const at::Tensor before = model->forward(x).detach();
  // As Module::to(kDouble) does: set_data on every registered tensor.
  {
    const at::NoGradGuard no_grad;
    for (at::Tensor p : model->parameters()) p.set_data(p.to(at::kDouble));
    for (at::Tensor b : model->buffers()) {
      if (b.is_floating_point()) b.set_data(b.to(at::kDouble));
    }
  }
  const at::Tensor cast = model->forward(x.to(at::kDouble));
  EXPECT_EQ(cast.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::allclose(cast.to(at::kFloat), before, 1e-5, 1e-6));
  // An in-place update (an optimizer step) of the registered tensor is the module's.
  {
    const at::NoGradGuard no_grad;
    parameter(*model, "head.bias").add_(1.0);
  }
  const at::Tensor shifted = model->forward(x.to(at::kDouble)).to(at::kFloat);
  EXPECT_TRUE(at::allclose(shifted, before + 0.5, 1e-5, 1e-5));  // scale = 0.5
}

TEST(TorchscriptTest, TrainAndEvalReachTheScriptedBatchNorm) {
  auto model = build("net.pt");
  at::manual_seed(2);
  const at::Tensor x = at::randn({8, 1, kSize, kSize}) * 3 + 1;
  const at::Tensor count = buffer(*model, "features.1.num_batches_tracked");
  const at::Tensor mean = buffer(*model, "features.1.running_mean");
  model->train(true);
  EXPECT_TRUE(model->is_training());
  const at::Tensor trained = model->forward(x).detach();
  EXPECT_EQ(count.item<int64_t>(), 1);  // the create-time check ran in eval mode
  EXPECT_GT(mean.abs().sum().item<double>(), 0.0);
  const at::Tensor mean_after = mean.clone();
  model->train(false);
  EXPECT_FALSE(model->is_training());
  const at::Tensor evaluated = model->forward(x).detach();
  EXPECT_EQ(count.item<int64_t>(), 1);
  EXPECT_TRUE(at::equal(mean, mean_after));
  EXPECT_FALSE(at::allclose(trained, evaluated, 1e-3, 1e-3));  // batch vs running statistics
}

// torch's BatchNorm2d (and only it) is a kiln::NormLayer to the host, in a scripted and a traced
// file alike (the trace's class name carries TorchScript's ___torch_mangle_N), and that layer's
// forward is the scripted batch norm's: F.batch_norm with its own tensors, here in eval mode
// (which the trace, fixed in the training mode it was traced in, does not follow).
TEST(TorchscriptTest, TorchsBatchNormIsANormLayerToTheHost) {
  for (const char* file : {"net.pt", "traced.pt"}) {
    auto model = build(file);
    std::set<std::string> norms;
    std::shared_ptr<kiln::NormLayer> norm;
    for (const auto& item : model->named_modules("", /*include_self=*/false)) {
      auto layer = std::dynamic_pointer_cast<kiln::NormLayer>(item.value());
      if (layer == nullptr) continue;
      norms.insert(item.key());
      norm = layer;
    }
    ASSERT_EQ(norms, std::set<std::string>{"features.1"}) << file;
    if (std::string(file) == "traced.pt") continue;
    at::manual_seed(4);
    const at::Tensor x = at::randn({3, 4, kSize, kSize}) * 2 + 1;
    model->train(false);
    const at::Tensor want = at::batch_norm(
        x, *norm->named_parameters().find("weight"), *norm->named_parameters().find("bias"),
        buffer(*model, "features.1.running_mean"), buffer(*model, "features.1.running_var"),
        /*training=*/false, 0.1, 1e-5, /*cudnn_enabled=*/false);
    EXPECT_TRUE(at::equal(norm->forward(x), want));
  }
}

TEST(TorchscriptTest, RefusesFilesThatCannotTrainNamingPathAndFile) {
  struct Case {
    std::string file;
    int64_t channels;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"", 1, "torchscript: path '': empty"},
      {"missing.pt", 1, "': no such file"},
      {"state.pt", 1, "': not a TorchScript archive"},
      {"seven.pt", 1, "gave [1, 7]; the dataset wants logits [1, 10] (10 classes)"},
      {"tuple.pt", 1, "forward returned Tuple, not a tensor of logits"},
      {"net.pt", 3, "forward on a zero batch of the dataset's shape [1, 3, 12, 12] failed: "},
  };
  for (const Case& c : cases) {
    Created created = create(c.file, c.channels);
    ASSERT_TRUE(created.status) << c.file;
    EXPECT_EQ(created.model, nullptr);
    EXPECT_EQ(created.status->code, KILN_ERR_INVALID_ARGUMENT) << created.status->message;
    EXPECT_NE(created.status->message.find(c.expect), std::string::npos) << created.status->message;
    EXPECT_EQ(
        created.status->message.rfind(
            "torchscript: path '" + (c.file.empty() ? std::string() : files().path(c.file)), 0),
        0u)
        << created.status->message;
  }
}

}  // namespace
}  // namespace kiln_test
