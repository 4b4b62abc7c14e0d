// `model.name = "torchscript"` through `kiln run`, against the Python module it came from
// (tests/oracle/torchscript_train.py): the scripted file and a traced one train step by step as
// the eager module does in PyTorch (same data in order, SGD with momentum and weight decay) and
// evaluate to its test loss and accuracy in eval mode; model.init starts it from other weights;
// a resumed run continues bit for bit; o2 keeps its batch norm float32 as apex O2 does, and
// norm_decay_mult reaches that batch norm. What it cannot honour is a configuration error at its
// key before the run (exit 2): a missing or foreign file (model.path), activation checkpointing
// (memory.checkpoint), the pipeline's norm (norm.name, model.norm, a [norm] key) and o3 with its
// batch norm's running statistics in bfloat16 (precision.name).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "kiln_test_paths.h"
#include "scratch.hpp"
#include "shell.hpp"

namespace {

using Result = kiln::test::ShellResult;
using kiln::test::shell;

// 6 batches of 16 per epoch, in order; 48 test images.
constexpr int kTrain = 96, kTest = 48, kSize = 12, kSeed = 3, kBatch = 16, kSteps = 6;
constexpr double kMean = 0.3, kStd = 0.3, kLr = 0.05, kMomentum = 0.9, kDecay = 5e-4;
// float32 on one thread, the same operations as PyTorch's eager module: the losses agree to
// float rounding; 1e-5 relative leaves room for a reordered sum and fails on any real change.
constexpr double kTolerance = 1e-5;

struct Metrics {
  std::vector<double> losses;  // per step
  double test_loss = NAN, test_accuracy = NAN;
};

class TorchscriptRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new kiln::test::Scratch();
    scratch_->write_text("config.json", R"({"phase": "prepare", "seed": )" + std::to_string(kSeed) +
                                            R"(, "train": )" + std::to_string(kTrain) +
                                            R"(, "test": )" + std::to_string(kTest) +
                                            R"(, "size": )" + std::to_string(kSize) + "}");
    scratch_->run("torchscript_train.py");
  }
  static void TearDownTestSuite() { delete scratch_; }

  // A pipeline on the prepared data that trains `file`; `extra` is appended TOML.
  static std::string pipeline(const std::string& name, const std::string& file,
                              const std::string& model_extra = "", const std::string& extra = "") {
    std::ostringstream t;
    t << "[run]\ndevice = \"cpu\"\nseed = 1\nepochs = 1\ntensorboard = false\nthreads = 1\n"
      << "output_dir = \"" << scratch_->path(name) << "\"\n"
      << "[data]\ndataset = \"fashion-mnist\"\nroot = \"" << scratch_->path("") << "\"\n"
      << "batch_size = " << kBatch << "\nworkers = 0\nshuffle = false\nmean = " << kMean
      << "\nstd = " << kStd << "\n"
      << "[model]\nname = \"torchscript\"\npath = \"" << scratch_->path(file) << "\"\n"
      << model_extra << "[optimizer]\nname = \"sgd\"\nlr = " << kLr << "\nmomentum = " << kMomentum
      << "\nweight_decay = " << kDecay << "\n"
      << "[lr_policy]\nname = \"constant\"\n"
      << extra;
    scratch_->write_text(name + ".toml", t.str());
    return scratch_->path(name + ".toml");
  }

  static Metrics read_metrics(const std::string& path) {
    Metrics m;
    const std::string text = scratch_->read_text(path);
    const std::regex step(R"(\{"type":"step","step":\d+,"epoch":\d+,"loss":([^,}]+))");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), step);
         it != std::sregex_iterator(); ++it) {
      m.losses.push_back(std::stod((*it)[1]));
    }
    std::smatch e;
    if (std::regex_search(text, e,
                          std::regex(R"("type":"eval".*"accuracy":([^,]+),"loss":([^}]+))"))) {
      m.test_accuracy = std::stod(e[1]);
      m.test_loss = std::stod(e[2]);
    }
    return m;
  }

  // `kiln run` of pipeline `name` (plus `args`); its metrics, written to `tag`.jsonl (default:
  // the name).
  static Metrics run(const std::string& name, const std::string& args = "",
                     const std::string& tag = "") {
    const std::string metrics = (tag.empty() ? name : tag) + ".jsonl";
    const Result r = shell(std::string(KILN_CLI) + " run " + scratch_->path(name + ".toml") +
                           " --metrics " + scratch_->path(metrics) + " " + args);
    EXPECT_EQ(r.code, 0) << name << ":\n" << r.output;
    return read_metrics(metrics);
  }

  // The eager PyTorch module trained as Kiln trains it; `init`: other starting weights; `extra`:
  // more of the oracle's options, as JSON members (`"precision": "o2"`).
  static Metrics oracle(int steps, const std::string& init = "", const std::string& extra = "",
                        double decay = kDecay) {
    std::ostringstream c;
    c << R"({"phase": "train", "size": )" << kSize << R"(, "lr": )" << kLr << R"(, "momentum": )"
      << kMomentum << R"(, "weight_decay": )" << decay << R"(, "batch": )" << kBatch
      << R"(, "steps": )" << steps << R"(, "mean": )" << kMean << R"(, "std": )" << kStd
      << R"(, "init": ")" << init << '"' << (extra.empty() ? "" : ", " + extra) << "}";
    scratch_->write_text("config.json", c.str());
    scratch_->run("torchscript_train.py");
    Metrics m;
    const std::string json = scratch_->read_text("result.json");
    std::smatch list;
    EXPECT_TRUE(std::regex_search(json, list, std::regex(R"("losses": \[([^\]]*)\])"))) << json;
    std::stringstream in(list[1].str());
    for (std::string item; std::getline(in, item, ',');) m.losses.push_back(std::stod(item));
    std::smatch v;
    if (std::regex_search(json, v, std::regex(R"("test_loss": ([^,}]+))"))) {
      m.test_loss = std::stod(v[1]);
    }
    if (std::regex_search(json, v, std::regex(R"("test_accuracy": ([^,}]+))"))) {
      m.test_accuracy = std::stod(v[1]);
    }
    return m;
  }

  static void expect_near(const std::vector<double>& got, const std::vector<double>& want,
                          const std::string& what, double tolerance = kTolerance) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], tolerance * std::abs(want[i])) << what << ", step " << i + 1;
      worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
    }
    std::printf("%s: %zu steps, largest relative difference %.3g\n", what.c_str(), got.size(),
                worst);
  }

  // A refusal before the run: exit 2, the output starting with `location` and holding `reason`.
  static void expect_refused(const std::string& command, const std::string& location,
                             const std::string& reason) {
    const Result r = shell(std::string(KILN_CLI) + " " + command);
    EXPECT_EQ(r.code, 2) << command << "\n" << r.output;
    EXPECT_EQ(r.output.rfind(location, 0), 0u) << command << "\n" << r.output;
    EXPECT_NE(r.output.find(reason), std::string::npos) << command << "\n" << r.output;
    EXPECT_EQ(r.output.find("training"), std::string::npos) << r.output;
  }

  static kiln::test::Scratch* scratch_;
};

kiln::test::Scratch* TorchscriptRun::scratch_ = nullptr;

TEST_F(TorchscriptRun, ScriptedAndTracedModulesTrainAsInPyTorch) {
  const Metrics want = oracle(kSteps);
  // The comparison can fail: the loss moves over the steps.
  ASSERT_GT(std::abs(want.losses.front() - want.losses.back()), 0.05);
  pipeline("scripted", "net.pt");
  const Metrics scripted = run("scripted");
  expect_near(scripted.losses, want.losses, "scripted");
  // Evaluation in eval mode: batch norm's running statistics, as the eager module's.
  EXPECT_NEAR(scripted.test_loss, want.test_loss, kTolerance * want.test_loss);
  EXPECT_NEAR(scripted.test_accuracy, want.test_accuracy, 1e-9);

  // A trace: training mode as traced, so the training steps agree (evaluation would not: a trace
  // keeps the batch norm's mode it was traced in, which the docs say).
  pipeline("traced", "traced.pt");
  const Metrics traced = run("traced", "--set run.eval=false");
  expect_near(traced.losses, want.losses, "traced");

  // The graph executor's optimisations on: the same model, the same losses to float rounding.
  pipeline("optimized", "net.pt", "optimize = true\n");
  expect_near(run("optimized").losses, want.losses, "optimize = true");
}

TEST_F(TorchscriptRun, ModelInitStartsFromOtherWeights) {
  pipeline("init", "net.pt", "init = \"" + scratch_->path("other.safetensors") + "\"\n");
  const Metrics got = run("init", "--set run.eval=false");
  const Metrics want = oracle(kSteps, "other.safetensors");
  expect_near(got.losses, want.losses, "model.init");
  EXPECT_GT(std::abs(got.losses.front() - oracle(1).losses.front()), 1e-3);
}

TEST_F(TorchscriptRun, AResumedRunContinuesBitForBit) {
  pipeline("straight", "net.pt");
  const std::string args = "--set run.epochs=2 --set run.checkpoint_every=3 --set run.eval=false";
  const Metrics straight = run("straight", args);
  ASSERT_EQ(straight.losses.size(), 2u * kSteps);
  // From the checkpoint after step 6 (batch norm's statistics and momentum buffers included).
  char dir[32];
  std::snprintf(dir, sizeof dir, "step-%09d", kSteps);
  const std::string checkpoint = scratch_->path("straight") + "/version_0/checkpoints/" + dir;
  const Metrics resumed = run("straight", args + " --resume " + checkpoint, "resumed");
  ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(resumed.losses[i], straight.losses[kSteps + i]) << "step " << kSteps + i + 1;
  }
}

// Under o2 the module's BatchNorm2d stays float32 while the rest runs in bfloat16 (apex O2's
// keep_batchnorm_fp32), as the oracle does by hand with torch's own modules.
TEST_F(TorchscriptRun, UnderO2ItsBatchNormStaysFloat32AsApexKeepsIt) {
  const Metrics want = oracle(kSteps, "", R"("precision": "o2")");
  pipeline("o2", "net.pt", "", "[precision]\nname = \"o2\"\n");
  const Metrics got = run("o2", "--set run.checkpoint_every=" + std::to_string(kSteps));
  // The same bfloat16 operations on one thread: the losses agree as in float32 (they are equal
  // here). Batch norm cast to bfloat16 with the rest is 2.5e-4 relative off by step 6.
  expect_near(got.losses, want.losses, "o2");
  EXPECT_NEAR(got.test_loss, want.test_loss, kTolerance * want.test_loss);

  char dir[32];
  std::snprintf(dir, sizeof dir, "step-%09d", kSteps);
  const std::string weights = scratch_->path("o2") + "/version_0/checkpoints/" + dir;
  scratch_->write_text("config.json", R"({"phase": "compare", "a": ")" + weights +
                                          R"(/model.safetensors", "b": ")" +
                                          scratch_->path("oracle.safetensors") + "\"}");
  scratch_->run("torchscript_train.py");
  const std::string diff = scratch_->read_text("diff.json");
  for (const char* name : {"features.1.weight", "features.1.bias", "features.1.running_mean",
                           "features.1.running_var"}) {
    EXPECT_NE(diff.find("\"" + std::string(name) + "\": \"torch.float32\""), std::string::npos)
        << name << ": " << diff;
  }
  EXPECT_NE(diff.find(R"("features.0.weight": "torch.bfloat16")"), std::string::npos) << diff;
  std::smatch max;
  ASSERT_TRUE(std::regex_search(diff, max, std::regex(R"("max": ([^,}]+))"))) << diff;
  EXPECT_LT(std::stod(max[1]), 1e-6) << diff;  // 1e-2 with batch norm in bfloat16
  EXPECT_NE(diff.find(R"("missing": [])"), std::string::npos) << diff;
}

// The module's batch norm is a norm layer to the parameter groups: norm_decay_mult = 0 takes its
// weight and bias out of weight decay, as torch.optim.SGD with that group does.
TEST_F(TorchscriptRun, NormDecayMultReachesItsBatchNorm) {
  constexpr double kStrongDecay = 0.5;  // large enough that the batch norm's share shows
  const Metrics want = oracle(kSteps, "", R"("norm_decay": 0.0)", kStrongDecay);
  const Metrics decayed = oracle(kSteps, "", "", kStrongDecay);
  pipeline("norm_decay", "net.pt");
  const Metrics got = run("norm_decay",
                          "--set optimizer.norm_decay_mult=0 --set run.eval=false "
                          "--set optimizer.weight_decay=" +
                              std::to_string(kStrongDecay));
  expect_near(got.losses, want.losses, "norm_decay_mult = 0");
  // The comparison can fail: decaying the batch norm too gives other losses.
  EXPECT_GT(std::abs(decayed.losses.back() - want.losses.back()),
            100 * kTolerance * std::abs(want.losses.back()));
}

// The module's LayerNorm and GroupNorm are norm parameters too (cast with the model, as they
// take one dtype): norm_decay_mult = 0 trains as SGD with every torch norm in a no-decay group.
TEST_F(TorchscriptRun, ItsLayerAndGroupNormAreNormParametersCastWithTheModel) {
  constexpr double kStrongDecay = 0.5;
  const Metrics want =
      oracle(kSteps, "", R"("model": "norms.pt", "norm_decay": 0.0)", kStrongDecay);
  const Metrics decayed = oracle(kSteps, "", R"("model": "norms.pt")", kStrongDecay);
  pipeline("other_norms", "norms.pt");
  const std::string decay = "--set optimizer.weight_decay=" + std::to_string(kStrongDecay);
  const Metrics got =
      run("other_norms", "--set optimizer.norm_decay_mult=0 --set run.eval=false " + decay);
  expect_near(got.losses, want.losses, "norm_decay_mult = 0, LayerNorm and GroupNorm");
  EXPECT_GT(std::abs(decayed.losses.back() - want.losses.back()),
            100 * kTolerance * std::abs(want.losses.back()));
  // Without the rule they decay as any parameter: the oracle's plain SGD.
  expect_near(run("other_norms", "--set run.eval=false " + decay, "other_norms_decayed").losses,
              decayed.losses, "decayed");
  // Under o2 they are cast to bfloat16 with the rest (apex O2 keeps only batch norm float32).
  const Metrics o2 = oracle(kSteps, "", R"("model": "norms.pt", "precision": "o2")");
  pipeline("other_norms_o2", "norms.pt", "", "[precision]\nname = \"o2\"\n");
  expect_near(run("other_norms_o2", "--set run.eval=false").losses, o2.losses, "o2");
}

// `kiln evaluate`: PyTorch's trained weights, evaluated by Kiln, give PyTorch's own test loss and
// accuracy; a run's checkpoint gives that run's last evaluation; nothing else is written.
TEST_F(TorchscriptRun, EvaluateGivesPyTorchsFiguresForPyTorchsWeights) {
  const Metrics want = oracle(kSteps);  // also writes its final weights, oracle.safetensors
  const std::string path = pipeline("evaluate", "net.pt");
  const std::string kiln = std::string(KILN_CLI) + " evaluate " + path;
  const Result r = shell(kiln + " --weights " + scratch_->path("oracle.safetensors") +
                         " --metrics " + scratch_->path("evaluate_torch.jsonl"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("test accuracy "), std::string::npos) << r.output;
  const Metrics torch = read_metrics("evaluate_torch.jsonl");
  EXPECT_NEAR(torch.test_loss, want.test_loss, kTolerance * want.test_loss);
  EXPECT_NEAR(torch.test_accuracy, want.test_accuracy, 1e-9);
  // Evaluation writes no run folder (the pipeline's output_dir stays absent).
  EXPECT_NE(shell("test -e " + scratch_->path("evaluate")).code, 0) << r.output;

  // A run's newest checkpoint (auto, and its output folder named): the run's final figures.
  const Metrics trained = run("evaluate");
  for (const std::string& from : {std::string("auto"), scratch_->path("evaluate")}) {
    const Result e = shell(kiln + " --checkpoint " + from + " --metrics " +
                           scratch_->path("evaluate_" + std::to_string(from.size()) + ".jsonl"));
    ASSERT_EQ(e.code, 0) << e.output;
    const Metrics m = read_metrics("evaluate_" + std::to_string(from.size()) + ".jsonl");
    EXPECT_EQ(m.test_loss, trained.test_loss) << from;
    EXPECT_EQ(m.test_accuracy, trained.test_accuracy) << from;
  }

  // Nothing to evaluate, or no checkpoint where it points: configuration errors (exit 2).
  const Result none = shell(kiln);
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_NE(none.output.find("nothing to evaluate"), std::string::npos) << none.output;
  const Result missing = shell(kiln + " --checkpoint " + scratch_->path("no_such_run"));
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find("no checkpoint here"), std::string::npos) << missing.output;
  const Result untrained = shell(std::string(KILN_CLI) + " evaluate " +
                                 pipeline("untrained", "net.pt") + " --checkpoint auto");
  EXPECT_EQ(untrained.code, 2) << untrained.output;
  EXPECT_NE(untrained.output.find("--checkpoint auto: no checkpoint under"), std::string::npos)
      << untrained.output;
}

TEST_F(TorchscriptRun, WhatItCannotHonourIsRefusedAtItsKey) {
  const std::string path = pipeline("refusals", "net.pt");
  struct Case {
    std::string set, location, reason;
  };
  const std::vector<Case> cases = {
      {"model.path='\"" + scratch_->path("missing.pt") + "\"'", "--set model.path=",
       "model.path: model 'torchscript' could not be built: torchscript: path '" +
           scratch_->path("missing.pt") + "': no such file"},
      {"model.path='\"" + scratch_->path("state.pt") + "\"'",
       "--set model.path=", "': not a TorchScript archive"},
      {"model.path='\"" + scratch_->path("seven.pt") + "\"'",
       "--set model.path=", "gave [1, 7]; the dataset wants logits [1, 10] (10 classes)"},
      {"memory.checkpoint=sqrt", "--set memory.checkpoint=sqrt",
       "memory.checkpoint: model 'torchscript' exposes no blocks to checkpoint"},
      {"norm.name=frozen_bn", "--set norm.name=frozen_bn",
       "norm.name: model 'torchscript' builds no norm layers through the host"},
      {"model.norm=syncbn", "--set model.norm=syncbn",
       "model.norm: model 'torchscript' builds no norm layers through the host"},
      {"norm.momentum=0.3", "--set norm.momentum=0.3",
       "norm.momentum: model 'torchscript' builds no norm layers through the host"},
      // Its BatchNorm2d's running statistics in bfloat16 (as for the host's own norm layers).
      {"precision.name=o3", "--set precision.name=o3",
       "would keep the running statistics of norm layer 'features.1' in bfloat16"},
  };
  for (const Case& c : cases) {
    for (const char* command : {"validate ", "run "}) {
      expect_refused(command + path + " --set " + c.set, c.location, c.reason);
    }
  }
  // o3 keeping the norm layers in float32 is apex's O3 with keep_batchnorm_fp32: accepted.
  const Result kept = shell(std::string(KILN_CLI) + " validate " + path +
                            " --set precision.name=o3 --set precision.keep_norm_fp32=true");
  EXPECT_EQ(kept.code, 0) << kept.output;
  // The default norm, named or not, is no choice: accepted.
  EXPECT_EQ(shell(std::string(KILN_CLI) + " validate " + path + " --set norm.name=batchnorm").code,
            0);
  // The rule is the host's, for any model that asks for no norm layer: an mlp without
  // norm_layers too, and with them the same norm is accepted.
  scratch_->write_text("mlp.toml",
                       "[run]\ndevice = \"cpu\"\n[data]\ndataset = \"synthetic\"\n"
                       "[model]\nname = \"mlp\"\nhidden = [8]\n");
  const std::string mlp = scratch_->path("mlp.toml");
  expect_refused("validate " + mlp + " --set norm.name=frozen_bn", "--set norm.name=frozen_bn",
                 "norm.name: model 'mlp' builds no norm layers through the host");
  const Result with_layers = shell(std::string(KILN_CLI) + " validate " + mlp +
                                   " --set norm.name=frozen_bn --set model.norm_layers=true");
  EXPECT_EQ(with_layers.code, 0) << with_layers.output;
}

TEST_F(TorchscriptRun, TrainsOnTwoDataParallelRanks) {
  // DDP over the registered parameters (Gloo on the CPU); each rank's batch norm sees its half.
  pipeline("ddp", "net.pt");
  const std::string metrics = scratch_->path("ddp.jsonl");
  const Result r = shell(std::string(KILN_CLI) + " launch --nproc 2 " + scratch_->path("ddp.toml") +
                         " --metrics " + metrics);
  ASSERT_EQ(r.code, 0) << r.output;
  const Metrics m = read_metrics("ddp.jsonl");
  ASSERT_EQ(m.losses.size(), static_cast<size_t>(kSteps)) << r.output;
  for (double loss : m.losses) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(m.test_accuracy, 0.0);
}

}  // namespace
