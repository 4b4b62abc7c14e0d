// [loss] and a model's own loss through `kiln run`, against a PyTorch loop on the same data and
// initial weights (tests/oracle/loss_train.py): one epoch of SGD, per-step losses and the
// evaluation (top-1, top-5, loss) from the metrics file
// - the mlp with cross-entropy, label smoothing and class weights; with bce_with_logits;
// - mse_linear (tests/plugins/loss_model.cpp), whose plugin computes its own loss (MSE to
//   one-hot), and the same model as a 1.7 plugin (no loss slot) training with the host's [loss];
// and the configuration errors: [loss] keys beside a model with its own loss, class_weights of
// another length than the classes, a misspelt key (exit 2, file:line:column).
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>

#include "kiln_test_paths.h"
#include "scratch.hpp"
#include "shell.hpp"

namespace {

using Result = kiln::test::ShellResult;
using kiln::test::shell;

// 100 training samples in batches of 32 (the last of 4), 40 test samples in batches of 16.
constexpr int kTrain = 100, kTest = 40, kSize = 6, kSeed = 5, kBatch = 32;
constexpr double kMean = 0.3, kStd = 0.3, kLr = 0.2;
const char* kHidden = "[12]";
// float32 training of four steps, the same operations: 1e-5 relative.
constexpr double kTolerance = 1e-5;

class LossRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new kiln::test::Scratch();
    scratch_->write_text("config.json", R"({"phase": "prepare", "seed": )" + std::to_string(kSeed) +
                                            R"(, "train": )" + std::to_string(kTrain) +
                                            R"(, "test": )" + std::to_string(kTest) +
                                            R"(, "size": )" + std::to_string(kSize) +
                                            R"(, "hidden": )" + kHidden + "}");
    scratch_->run("loss_train.py");
  }
  static void TearDownTestSuite() {
    delete scratch_;
    scratch_ = nullptr;
  }

  // A pipeline `name` over the prepared data: model "mlp" or "mse_linear" (from `plugins`, a
  // folder under the test plugins), `loss` the [loss] table's body.
  static std::string pipeline(const std::string& name, const std::string& model,
                              const std::string& loss, const std::string& plugins = "") {
    std::ostringstream t;
    t << "[run]\ndevice = \"cpu\"\nseed = 1\nepochs = 1\nlog_interval = 1\ntensorboard = false\n"
      << "checkpoints = false\nthreads = 1\noutput_dir = \"" << scratch_->path(name) << "\"\n"
      << "[data]\ndataset = \"fashion-mnist\"\nroot = \"" << scratch_->path("") << "\"\n"
      << "batch_size = " << kBatch << "\neval_batch_size = 16\nworkers = 0\nshuffle = false\n"
      << "mean = " << kMean << "\nstd = " << kStd << "\n"
      << "[model]\nname = \"" << model << "\"\n"
      << (model == "mlp" ? std::string("hidden = ") + kHidden + "\n" : "") << "init = \""
      << scratch_->path(model == "mlp" ? "mlp.safetensors" : "linear.safetensors") << "\"\n"
      << "[optimizer]\nname = \"sgd\"\nlr = " << kLr << "\nmomentum = 0.0\n"
      << "[loss]\n"
      << loss;
    if (!plugins.empty()) {
      t << "[plugins]\npaths = [\"" << KILN_TEST_PLUGIN_DIR << "/" << plugins << "\"]\n";
    }
    scratch_->write_text(name + ".toml", t.str());
    return scratch_->path(name + ".toml");
  }

  // Runs `name` and compares its metrics with the PyTorch loop training `model` with `loss`
  // (loss_train.py's JSON form); a failure names the largest differences.
  static void expect_matches_torch(const std::string& name, const std::string& model,
                                   const std::string& loss_json) {
    const std::string metrics = scratch_->path(name + ".jsonl");
    const Result r = shell(std::string(KILN_CLI) + " run " + scratch_->path(name + ".toml") +
                           " --metrics " + metrics);
    ASSERT_EQ(r.code, 0) << r.output;
    std::ostringstream c;
    c << R"({"phase": "compare", "model": ")" << model << R"(", "loss": )" << loss_json
      << R"(, "metrics": ")" << metrics << R"(", "size": )" << kSize << R"(, "hidden": )" << kHidden
      << R"(, "batch": )" << kBatch << R"(, "lr": )" << kLr << R"(, "mean": )" << kMean
      << R"(, "std": )" << kStd << "}";
    scratch_->write_text("config.json", c.str());
    scratch_->run("loss_train.py");
    const std::string report = scratch_->read_text("report.json");
    auto number = [&](const std::string& key) {
      std::smatch m;
      const std::regex re("\"" + key + "\": ([-0-9.e+]+)");
      return std::regex_search(report, m, re) ? std::stod(m[1]) : 1e9;
    };
    EXPECT_EQ(number("steps"), 4) << report;
    EXPECT_EQ(number("expected_steps"), 4) << report;
    EXPECT_EQ(number("evals"), 1) << report;
    EXPECT_LE(number("step_loss"), kTolerance) << report;
    EXPECT_LE(number("eval_loss"), kTolerance) << report;
    // Fractions of 40 samples (one is 0.025), PyTorch's in float32: the same count.
    EXPECT_LE(number("accuracy"), 1e-6) << report;
    EXPECT_LE(number("top5"), 1e-6) << report;
    EXPECT_GT(number("expected_top5"), 0.0) << report;
    EXPECT_NE(r.output.find("top-5"), std::string::npos) << r.output;
  }

  static kiln::test::Scratch* scratch_;
};

kiln::test::Scratch* LossRun::scratch_ = nullptr;

TEST_F(LossRun, CrossEntropyWithLabelSmoothingAndClassWeightsMatchesTorch) {
  const char* weights = "[0.5, 1.0, 1.5, 2.0, 0.75, 1.25, 1.0, 0.6, 1.8, 1.1]";
  pipeline("ce", "mlp", std::string("label_smoothing = 0.1\nclass_weights = ") + weights + "\n");
  expect_matches_torch(
      "ce", "mlp",
      std::string(R"({"name": "cross_entropy", "label_smoothing": 0.1, "class_weights": )") +
          weights + "}");
}

TEST_F(LossRun, BinaryCrossEntropyWithSmoothingMatchesTorch) {
  pipeline("bce", "mlp", "name = \"bce_with_logits\"\nlabel_smoothing = 0.1\n");
  expect_matches_torch("bce", "mlp", R"({"name": "bce_with_logits", "label_smoothing": 0.1})");
}

TEST_F(LossRun, AModelsOwnLossTrainsAndEvaluates) {
  pipeline("own", "mse_linear", "", "loss_model");
  expect_matches_torch("own", "mse_linear", R"({"name": "mse"})");
}

// A 1.7 plugin's vtable ends before the slot (what lies after it would abort): [loss] applies.
TEST_F(LossRun, AModelBuiltFor17TrainsWithTheHostsLoss) {
  pipeline("old", "mse_linear", "label_smoothing = 0.1\n", "loss_model_v1_7");
  expect_matches_torch("old", "mse_linear", R"({"name": "cross_entropy", "label_smoothing": 0.1})");
}

TEST_F(LossRun, ConfigurationErrorsNameTheKeyAndWhereItIs) {
  const std::string own =
      pipeline("own_refused", "mse_linear", "label_smoothing = 0.1\n", "loss_model");
  Result r = shell(std::string(KILN_CLI) + " run " + own);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("own_refused.toml:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(": loss.label_smoothing: model 'mse_linear' computes its own loss"),
            std::string::npos)
      << r.output;

  const std::string weights = pipeline("weights", "mlp", "class_weights = [1.0, 2.0, 3.0]\n");
  r = shell(std::string(KILN_CLI) + " run " + weights);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(
          R"(weights\.toml:\d+:\d+: loss\.class_weights: has 3 values; the dataset has 10 classes)")))
      << r.output;

  const std::string typo = pipeline("typo", "mlp", "label_smothing = 0.1\n");
  r = shell(std::string(KILN_CLI) + " run " + typo);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("loss.label_smothing: unknown key; did you mean 'label_smoothing'?"),
            std::string::npos)
      << r.output;
}

}  // namespace
