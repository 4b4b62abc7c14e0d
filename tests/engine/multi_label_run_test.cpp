// Multi-label data through `kiln run`: the `tensors` dataset with target rows ([N, C], uint8 0/1
// or float32 soft values), trained with bce_with_logits against a PyTorch loop on the same files
// and initial weights (tests/oracle/multi_label_train.py): one epoch of SGD, per-step losses,
// and the evaluation's loss and mean average precision against torchmetrics'
// multilabel_average_precision; `kiln evaluate` and the metrics file report mAP instead of the
// accuracies. And the configuration errors (exit 2, file:line:column, before a step): a loss
// that takes one class per sample, a best checkpoint judged by accuracy, "map" for data of one
// class per sample.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>
#include <utility>

#include "kiln_test_paths.h"
#include "scratch.hpp"
#include "shell.hpp"

namespace {

using Result = kiln::test::ShellResult;
using kiln::test::shell;

// 100 training samples in batches of 32 (the last of 4), 61 validation samples (two ranks'
// evaluation shards then differ in size), 5 classes.
constexpr int kTrain = 100, kTest = 61, kSize = 6, kClasses = 5, kSeed = 3, kBatch = 32;
constexpr double kMean = 0.3, kStd = 0.3, kLr = 0.5;
const char* kHidden = "[16]";
// float32 training of four steps, the same operations: 1e-5 relative. The ranking behind mAP is
// of the same logits; its sums differ in the last bits at most.
constexpr double kTolerance = 1e-5;

class MultiLabelRun : public ::testing::Test {
 protected:
  // Writes the files of one variant ("hard": uint8 rows; "soft": float32) into its folder.
  static std::string prepare(const std::string& variant) {
    const std::string dir = scratch_->path(variant);
    scratch_->write_text("config.json",
                         R"({"phase": "prepare", "data": ")" + dir + R"(", "seed": )" +
                             std::to_string(kSeed) + R"(, "train": )" + std::to_string(kTrain) +
                             R"(, "test": )" + std::to_string(kTest) + R"(, "size": )" +
                             std::to_string(kSize) + R"(, "classes": )" + std::to_string(kClasses) +
                             R"(, "noise": 60, "hidden": )" + kHidden + R"(, "soft": )" +
                             (variant == "soft" ? "true" : "false") + "}");
    scratch_->run("multi_label_train.py");
    return dir;
  }

  static void SetUpTestSuite() {
    scratch_ = new kiln::test::Scratch();
    prepare("hard");
    prepare("soft");
  }
  static void TearDownTestSuite() {
    delete scratch_;
    scratch_ = nullptr;
  }

  // A pipeline `name` over variant `data` (or the synthetic set of one class per sample) with
  // `loss` as the [loss] table's body; `best` set: checkpoints kept, the best by that metric.
  static std::string pipeline(const std::string& name, const std::string& data,
                              const std::string& loss, const std::string& best = "", int epochs = 1,
                              const std::string& dataset = "tensors") {
    const std::string dir = scratch_->path(data);
    std::ostringstream t;
    t << "[run]\ndevice = \"cpu\"\nseed = 1\nepochs = " << epochs
      << "\nlog_interval = 1\ntensorboard = false\nthreads = 1\n"
      << (best.empty() ? "checkpoints = false\n"
                       : "checkpoints = true\ncheckpoint_best = \"" + best + "\"\n")
      << "output_dir = \"" << scratch_->path(name) << "\"\n"
      << "[data]\ndataset = \"" << dataset << "\"\n";
    if (dataset == "tensors") {
      t << "train = \"" << dir << "/train.safetensors\"\nval = \"" << dir << "/val.safetensors\"\n";
    } else {
      t << "synthetic_train = 100\nsynthetic_test = 60\nsynthetic_classes = " << kClasses
        << "\nchannels = 1\nheight = " << kSize << "\nwidth = " << kSize << "\n";
    }
    t << "batch_size = " << kBatch << "\neval_batch_size = 16\nworkers = 0\nshuffle = false\n"
      << "mean = " << kMean << "\nstd = " << kStd << "\n"
      << "[model]\nname = \"mlp\"\nhidden = " << kHidden << "\ninit = \"" << dir
      << "/mlp.safetensors\"\n"
      << "[optimizer]\nname = \"sgd\"\nlr = " << kLr << "\nmomentum = 0.0\n"
      << "[loss]\n"
      << loss;
    scratch_->write_text(name + ".toml", t.str());
    return scratch_->path(name + ".toml");
  }

  static double number(const std::string& report, const std::string& key) {
    std::smatch m;
    const std::regex re("\"" + key + "\": ([-0-9.e+]+)");
    return std::regex_search(report, m, re) ? std::stod(m[1]) : 1e9;
  }

  // Runs `name` and compares its metrics with the PyTorch loop (`loss_json` adds the loss's
  // settings to the oracle's config).
  static void expect_matches_torch(const std::string& name, const std::string& data,
                                   const std::string& loss_json, double min_map) {
    const std::string metrics = scratch_->path(name + ".jsonl");
    const Result r = shell(std::string(KILN_CLI) + " run " + scratch_->path(name + ".toml") +
                           " --metrics " + metrics);
    ASSERT_EQ(r.code, 0) << r.output;
    std::ostringstream c;
    c << R"({"phase": "compare", "data": ")" << scratch_->path(data) << R"(", "metrics": ")"
      << metrics << R"(", "size": )" << kSize << R"(, "classes": )" << kClasses << R"(, "hidden": )"
      << kHidden << R"(, "batch": )" << kBatch << R"(, "lr": )" << kLr << R"(, "mean": )" << kMean
      << R"(, "std": )" << kStd << loss_json << "}";
    scratch_->write_text("config.json", c.str());
    scratch_->run("multi_label_train.py");
    const std::string report = scratch_->read_text("report.json");
    EXPECT_EQ(number(report, "steps"), 4) << report;
    EXPECT_EQ(number(report, "expected_steps"), 4) << report;
    EXPECT_EQ(number(report, "evals"), 1) << report;
    EXPECT_LE(number(report, "step_loss"), kTolerance) << report;
    EXPECT_LE(number(report, "eval_loss"), kTolerance) << report;
    EXPECT_LE(number(report, "map"), 1e-6) << report;
    // A ranking to compare: the hard rows are learnt well above chance (about 0.4, the share of
    // positives) in an epoch; the soft ones, whose targets are 0.7 to 1 and 0 to 0.3, less.
    EXPECT_GT(number(report, "expected_map"), min_map) << report;
    EXPECT_EQ(number(report, "accuracy_is_null"), 1) << report;
    EXPECT_NE(r.output.find("final test mAP"), std::string::npos) << r.output;
  }

  // `kiln validate` of `toml`: exit 2 naming `key`, at file:line:column.
  static void expect_config_error(const std::string& toml, const std::string& key,
                                  const std::string& words) {
    const Result r = shell(std::string(KILN_CLI) + " validate " + toml);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(key), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(words), std::string::npos) << r.output;
    EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\.toml:\d+:\d+)"))) << r.output;
  }

  static kiln::test::Scratch* scratch_;
};

kiln::test::Scratch* MultiLabelRun::scratch_ = nullptr;

TEST_F(MultiLabelRun, Uint8RowsWithSmoothingAndPosWeightMatchTorchAndTorchmetrics) {
  const char* pos = "[1.0, 2.0, 0.5, 1.5, 3.0]";
  pipeline(
      "hard", "hard",
      std::string("name = \"bce_with_logits\"\nlabel_smoothing = 0.1\npos_weight = ") + pos + "\n");
  expect_matches_torch("hard", "hard",
                       std::string(R"(, "label_smoothing": 0.1, "pos_weight": )") + pos, 0.5);
}

TEST_F(MultiLabelRun, SoftFloatRowsMatchTorchAndTorchmetrics) {
  pipeline("soft", "soft", "name = \"bce_with_logits\"\n");
  expect_matches_torch("soft", "soft", "", 0.3);
}

TEST_F(MultiLabelRun, EvaluateAndTheMetricsFileReportMeanAveragePrecision) {
  const std::string toml = pipeline("evaluate", "hard", "name = \"bce_with_logits\"\n");
  const Result r = shell(std::string(KILN_CLI) + " evaluate " + toml + " --metrics " +
                         scratch_->path("evaluate.jsonl"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(test mAP \d+\.\d\d%, loss)"))) << r.output;
  EXPECT_EQ(r.output.find("accuracy"), std::string::npos) << r.output;
  const std::string line = scratch_->read_text("evaluate.jsonl");
  EXPECT_TRUE(std::regex_search(
      line, std::regex(R"("accuracy":null,"loss":[-0-9.e]+,"top5":null,"map":0\.[0-9e-]+\})")))
      << line;
}

// Two ranks (Gloo, each half the batch) train on the same samples and gather their evaluation
// shards of 31 and 30 samples: the split's mean average precision is the single process's.
TEST_F(MultiLabelRun, TwoRanksReportTheSingleProcessMap) {
  const std::string toml = pipeline("ranks", "hard", "name = \"bce_with_logits\"\n");
  const auto eval_line = [&](const std::string& command, const std::string& metrics) {
    const Result r = shell(std::string(KILN_CLI) + command + " " + toml + " --metrics " +
                           scratch_->path(metrics));
    EXPECT_EQ(r.code, 0) << r.output;
    const std::string text = scratch_->read_text(metrics);
    std::smatch m;
    EXPECT_TRUE(std::regex_search(
        text, m, std::regex(R"("loss":([-0-9.e]+),"top5":null,"map":([-0-9.e]+))")))
        << text;
    return std::make_pair(std::stod(m[1]), std::stod(m[2]));
  };
  const auto [one_loss, one_map] = eval_line(" run", "one.jsonl");
  const auto [two_loss, two_map] = eval_line(" launch --nproc 2", "two.jsonl");
  // The same ranking; the loss's sums go through an all-reduce in another order.
  EXPECT_NEAR(two_map, one_map, 1e-12);
  EXPECT_NEAR(two_loss, one_loss, 1e-6 * one_loss);
}

TEST_F(MultiLabelRun, ConfigurationErrorsNameTheKey) {
  expect_config_error(pipeline("ce", "hard", ""), "loss.name", "use \"bce_with_logits\"");
  expect_config_error(pipeline("best_accuracy", "hard", "name = \"bce_with_logits\"\n", "accuracy"),
                      "run.checkpoint_best", "use \"map\" or \"loss\"");
  expect_config_error(pipeline("best_map", "hard", "", "map", 1, "synthetic"),
                      "run.checkpoint_best", "needs multi-label data");
}

TEST_F(MultiLabelRun, BestCheckpointByMapIsKept) {
  const std::string toml = pipeline("best", "hard", "name = \"bce_with_logits\"\n", "map", 2);
  const Result r = shell(std::string(KILN_CLI) + " run " + toml);
  ASSERT_EQ(r.code, 0) << r.output;
  const Result best =
      shell("cat $(find " + scratch_->path("best") + " -name best.toml -path '*checkpoints*')");
  ASSERT_EQ(best.code, 0) << best.output;
  EXPECT_NE(best.output.find("map"), std::string::npos) << best.output;
}

}  // namespace
