// [ema] through `kiln run`, `kiln evaluate` and `kiln export`, against timm's ModelEmaV3 over the
// same trained weights (tests/oracle/ema_train.py): an mlp with batch norm trained for two
// epochs of SGD with a checkpoint after every step, whose `ema/` tensors must be timm's average
// at every step and whose evaluations must be timm's average evaluated
// - with warm-up, the cap at decay, and averaged buffers;
// - from start_step on, without warm-up, with copied buffers;
// that the average changes nothing the run trains (step losses and weights with it and without
// it), that a resumed run continues it exactly (and one resumed from a checkpoint without an
// average starts it there), that `kiln export --ema` writes it under the model's names, and the
// configuration errors.
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

// 100 training samples in batches of 32: 4 steps an epoch, 8 in the run; 40 test samples.
constexpr int kTrain = 100, kTest = 40, kSize = 6, kSeed = 3, kSteps = 8;
constexpr double kMean = 0.3, kStd = 0.3;
const char* kHidden = "[12, 10]";

class EmaRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new kiln::test::Scratch();
    std::ostringstream c;
    c << R"({"phase": "prepare", "seed": )" << kSeed << R"(, "train": )" << kTrain
      << R"(, "test": )" << kTest << R"(, "size": )" << kSize << R"(, "hidden": )" << kHidden
      << "}";
    scratch_->write_text("config.json", c.str());
    scratch_->run("ema_train.py");
  }
  static void TearDownTestSuite() {
    delete scratch_;
    scratch_ = nullptr;
  }

  // A pipeline `name` over the prepared data, a checkpoint after every step; `ema` is the [ema]
  // table's body ("" for none), `precision` the [precision] table's.
  static std::string pipeline(const std::string& name, const std::string& ema,
                              const std::string& precision = "name = \"fp32\"\n") {
    std::ostringstream t;
    t << "[run]\ndevice = \"cpu\"\nseed = 1\nepochs = 2\nlog_interval = 1\ntensorboard = false\n"
      << "checkpoint_every = 1\ncheckpoint_keep = 100\nthreads = 1\noutput_dir = \""
      << scratch_->path(name) << "\"\n"
      << "[data]\ndataset = \"fashion-mnist\"\nroot = \"" << scratch_->path("") << "\"\n"
      << "batch_size = 32\neval_batch_size = 16\nworkers = 0\nshuffle = false\n"
      << "mean = " << kMean << "\nstd = " << kStd << "\n"
      << "[model]\nname = \"mlp\"\nhidden = " << kHidden << "\nnorm_layers = true\ninit = \""
      << scratch_->path("mlp.safetensors") << "\"\n"
      << "[optimizer]\nname = \"sgd\"\nlr = 0.3\nmomentum = 0.9\n"
      << "[precision]\n"
      << precision;
    if (!ema.empty()) t << "[ema]\n" << ema;
    scratch_->write_text(name + ".toml", t.str());
    return scratch_->path(name + ".toml");
  }

  static std::string checkpoints(const std::string& name) {
    return scratch_->path(name + "/version_0/checkpoints");
  }

  static Result run(const std::string& name, const std::string& extra = "") {
    return shell(std::string(KILN_CLI) + " run " + scratch_->path(name + ".toml") + " --metrics " +
                 scratch_->path(name + ".jsonl") + extra);
  }

  // A number of report.json.
  static double number(const std::string& report, const std::string& key) {
    std::smatch m;
    const std::regex re("\"" + key + "\": ([-0-9.e+]+)");
    return std::regex_search(report, m, re) ? std::stod(m[1]) : 1e9;
  }

  // Replays run `name` through timm's ModelEmaV3 with `ema_json`'s settings (over its fp32
  // masters with `masters`).
  static std::string timm_report(const std::string& name, const std::string& ema_json,
                                 bool masters = false) {
    std::ostringstream c;
    c << R"({"phase": "average", "masters": )" << (masters ? "true" : "false") << R"(, "ema": )"
      << ema_json << R"(, "checkpoints": ")" << checkpoints(name) << R"(", "metrics": ")"
      << scratch_->path(name + ".jsonl") << R"(", "steps": )" << kSteps << R"(, "size": )" << kSize
      << R"(, "hidden": )" << kHidden << R"(, "mean": )" << kMean << R"(, "std": )" << kStd << "}";
    scratch_->write_text("config.json", c.str());
    scratch_->run("ema_train.py");
    return scratch_->read_text("report.json");
  }

  // Runs `name` and holds it to timm: the same average at every step, float32 (the same ATen
  // lerp on the same float32 tensors: exact), and both evaluations of the average. Returns the
  // report.
  static std::string expect_timms_average(const std::string& name, const std::string& ema_json,
                                          bool masters = false) {
    const Result r = run(name);
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("evaluation of the EMA weights"), std::string::npos) << r.output;
    const std::string report = timm_report(name, ema_json, masters);
    EXPECT_EQ(number(report, "steps"), kSteps) << report;
    // 3 layers' weight and bias, 2 norm layers' weight, bias, running mean and variance.
    EXPECT_EQ(number(report, "tensors"), 14) << report;
    EXPECT_NE(report.find("\"missing\": []"), std::string::npos) << report;
    EXPECT_EQ(number(report, "max_abs"), 0.0) << report;
    EXPECT_NE(report.find("\"dtypes\": [\"torch.float32\"]"), std::string::npos) << report;
    EXPECT_EQ(number(report, "evals"), 2) << report;
    EXPECT_EQ(number(report, "averaged_evals"), 2) << report;
    return report;
  }

  // The evaluations equal timm's average evaluated in PyTorch: the loss sums batches of 16 in
  // float32 (1e-5), the accuracy is the same count.
  static void expect_timms_evaluations(const std::string& report) {
    EXPECT_LE(number(report, "eval_loss"), 1e-5) << report;
    EXPECT_LE(number(report, "accuracy"), 1e-6) << report;
  }

  // report.json of ema_train.py's "equal" phase over runs `a` and `b` at `step`.
  static std::string compare_runs(const std::string& a, const std::string& b, int step) {
    std::ostringstream c;
    c << R"({"phase": "equal", "step": )" << step << R"(, "runs": [)";
    for (const std::string& name : {a, b}) {
      c << (name == a ? "" : ", ") << R"({"metrics": ")" << scratch_->path(name + ".jsonl")
        << R"(", "checkpoints": ")" << checkpoints(name) << R"("})";
    }
    c << "]}";
    scratch_->write_text("config.json", c.str());
    scratch_->run("ema_train.py");
    return scratch_->read_text("report.json");
  }

  static kiln::test::Scratch* scratch_;
};

kiln::test::Scratch* EmaRun::scratch_ = nullptr;

// decay 0.6 with warm-up (power 2/3): the copy at step 1, warm-up's 0.37 and 0.52 at steps 2
// and 3, then the cap at 0.6.
TEST_F(EmaRun, WarmUpAndAveragedBuffersFollowTimmModelEmaV3) {
  pipeline("warm", "decay = 0.6\nwarmup = true\n");
  expect_timms_evaluations(expect_timms_average("warm", R"({"decay": 0.6, "warmup": true})"));
}

// O2 in bfloat16: the optimizer steps fp32 masters of the half weights (the norm layers stay
// fp32), and the average is of the masters, in fp32: a bfloat16 average could not move by
// 1 - decay of a weight. (The evaluations run the half model, which timm's fp32 twin cannot
// give, so only the average is compared.)
TEST_F(EmaRun, AHalfModelAveragesItsFp32Masters) {
  pipeline("o2", "decay = 0.6\nwarmup = true\n", "name = \"o2\"\ndtype = \"bf16\"\n");
  expect_timms_average("o2", R"({"decay": 0.6, "warmup": true})", /*masters=*/true);
}

TEST_F(EmaRun, StartStepAndCopiedBuffersFollowTimmModelEmaV3) {
  pipeline("start", "decay = 0.5\nstart_step = 2\nbuffers = \"copy\"\n");
  expect_timms_evaluations(
      expect_timms_average("start", R"({"decay": 0.5, "start_step": 2, "buffers": "copy"})"));
}

// The average is swapped into the model for each evaluation and out after: the second epoch
// must train from the same weights as a run without it.
TEST_F(EmaRun, TheAverageChangesNothingTheRunTrains) {
  pipeline("with", "decay = 0.7\n");
  pipeline("without", "");
  for (const char* name : {"with", "without"}) {
    const Result r = run(name);
    ASSERT_EQ(r.code, 0) << r.output;
  }
  const std::string report = compare_runs("with", "without", kSteps);
  EXPECT_NE(report.find("\"steps\": [8, 8]"), std::string::npos) << report;
  EXPECT_EQ(number(report, "loss_gap"), 0.0) << report;
  EXPECT_EQ(number(report, "weights_gap"), 0.0) << report;
  EXPECT_NE(report.find("\"ema_tensors\": [14, 0]"), std::string::npos) << report;
}

TEST_F(EmaRun, AResumedRunContinuesTheAverage) {
  pipeline("whole", "decay = 0.8\nwarmup = true\n");
  pipeline("halves", "decay = 0.8\nwarmup = true\n");
  Result r = run("whole");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("halves", " --set run.max_steps=3");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("halves", " --resume auto");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  const std::string report = compare_runs("whole", "halves", kSteps);
  EXPECT_EQ(number(report, "weights_gap"), 0.0) << report;
  EXPECT_EQ(number(report, "ema_gap"), 0.0) << report;
  EXPECT_NE(report.find("\"ema_tensors\": [14, 14]"), std::string::npos) << report;

  // [ema] may change on resume: a checkpoint written without an average starts one from its
  // weights, and the run goes on.
  pipeline("late", "");
  r = run("late", " --set run.max_steps=5");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("late", " --resume auto --set ema.decay=0.9");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("ema: the checkpoint holds no average"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("evaluation of the EMA weights"), std::string::npos) << r.output;
}

// The export writes the average under the model's names: evaluated as model.init it gives the
// run's own evaluation of the average; `kiln evaluate` of the checkpoint measures the average
// unless ema.evaluate = false.
TEST_F(EmaRun, ExportAndEvaluateTakeTheAverage) {
  pipeline("export", "decay = 0.6\n");
  Result r = run("export");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string toml = scratch_->path("export.toml");
  const std::string file = scratch_->path("ema.safetensors");
  const std::string folder = scratch_->path("export/version_0");
  r = shell(std::string(KILN_CLI) + " export " + folder + " --ema --to " + file);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("14 moving-average tensors"), std::string::npos) << r.output;

  const std::regex accuracy(R"(test accuracy ([0-9.]+)%, top-5 [0-9.]+%, loss ([0-9.]+))");
  auto measured = [&](const std::string& args) {
    const Result e = shell(std::string(KILN_CLI) + " evaluate " + toml + " " + args);
    EXPECT_EQ(e.code, 0) << e.output;
    std::smatch m;
    return std::regex_search(e.output, m, accuracy) ? m[1].str() + " " + m[2].str() : e.output;
  };
  const std::string from_file = measured("--weights " + file + " --set ema.decay=0");
  const std::string averaged = measured("--checkpoint " + folder);
  const std::string trained = measured("--checkpoint " + folder + " --set ema.evaluate=false");
  EXPECT_EQ(from_file, averaged);
  EXPECT_NE(averaged, trained);

  pipeline("plain", "");
  ASSERT_EQ(run("plain").code, 0);
  r = shell(std::string(KILN_CLI) + " export " + scratch_->path("plain/version_0") +
            " --ema --to " + scratch_->path("none.safetensors"));
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--ema: the checkpoint holds no moving average of the weights"),
            std::string::npos)
      << r.output;
}

TEST_F(EmaRun, ConfigurationErrorsNameTheKeyAndWhereItIs) {
  const std::string one = pipeline("one", "decay = 1.0\n");
  Result r = shell(std::string(KILN_CLI) + " run " + one);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(
      std::regex_search(r.output, std::regex(R"(one\.toml:\d+:\d+: ema\.decay: must be below 1)")))
      << r.output;

  const std::string typo = pipeline("typo", "decy = 0.9\n");
  r = shell(std::string(KILN_CLI) + " run " + typo);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("ema.decy: unknown key; did you mean 'decay'?"), std::string::npos)
      << r.output;
}

}  // namespace
