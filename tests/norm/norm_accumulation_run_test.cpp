// norm.running_stats_update through `kiln run` and `kiln launch` (the trainer's windows of
// micro-batches, the epoch's short last window, the norm layers' reports), against a PyTorch
// training loop that moves batch norm's running statistics by hand
// (tests/oracle/norm_accumulation_train.py): an mlp with norm layers, accumulation 3 over 11
// batches (windows of 3, 3, 3 and 2), in every mode
// - batchnorm on one process and syncbn on two Gloo ranks (each half of every batch) end at the
//   oracle's weights and running statistics, to 1e-5;
// - pooled_window under activation checkpointing (recomputed forwards) ends there too;
// and a value the key does not know is a configuration error (exit 2, file:line:column).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kiln_test_paths.h"
#include "scratch.hpp"
#include "shell.hpp"

namespace {

using Result = kiln::test::ShellResult;
using kiln::test::shell;

// 11 batches of 32 in one epoch; windows of 3: steps of 3, 3, 3 and 2 micro-batches.
constexpr int kTrain = 352, kTest = 64, kSize = 8, kSeed = 4, kBatch = 32, kAccumulation = 3;
constexpr int kSteps = 4;
constexpr double kMean = 0.3, kStd = 0.3, kLr = 0.05, kMomentum = 0.9, kNormMomentum = 0.3;
const char* kHidden = "[24, 16]";
// float32 training of a few steps, the same operations in another order: 1e-5 absolute.
constexpr double kTolerance = 1e-5;

class NormAccumulationRun : public ::testing::Test {
 protected:
  void SetUp() override {
    scratch_.write_text("config.json", R"({"phase": "prepare", "seed": )" + std::to_string(kSeed) +
                                           R"(, "train": )" + std::to_string(kTrain) +
                                           R"(, "test": )" + std::to_string(kTest) +
                                           R"(, "size": )" + std::to_string(kSize) +
                                           R"(, "hidden": )" + kHidden + "}");
    scratch_.run("norm_accumulation_train.py");
  }

  // A pipeline on the prepared data and initial weights; `extra` is appended TOML.
  std::string pipeline(const std::string& name, const std::string& norm, const std::string& mode,
                       const std::string& extra = "") const {
    std::ostringstream t;
    t << "[run]\ndevice = \"cpu\"\nseed = 1\nepochs = 1\naccumulation_steps = " << kAccumulation
      << "\neval = false\ntensorboard = false\nthreads = 1\noutput_dir = \"" << scratch_.path(name)
      << "\"\n"
      << "[data]\ndataset = \"fashion-mnist\"\nroot = \"" << scratch_.path("") << "\"\n"
      << "batch_size = " << kBatch << "\nworkers = 0\nshuffle = false\nmean = " << kMean
      << "\nstd = " << kStd << "\n"
      << "[model]\nname = \"mlp\"\nhidden = " << kHidden << "\nnorm_layers = true\nnorm = \""
      << norm << "\"\ninit = \"" << scratch_.path("init.safetensors") << "\"\n"
      << "[norm]\nmomentum = " << kNormMomentum << "\nrunning_stats_update = \"" << mode << "\"\n"
      << "[optimizer]\nname = \"sgd\"\nlr = " << kLr << "\nmomentum = " << kMomentum << "\n"
      << "[lr_policy]\nname = \"constant\"\n"
      << extra;
    scratch_.write_text(name + ".toml", t.str());
    return scratch_.path(name + ".toml");
  }

  // `kiln run` (nproc 0) or `kiln launch --nproc N`; the final model.safetensors.
  std::string run(const std::string& name, int nproc) const {
    const std::string file = scratch_.path(name + ".toml");
    const Result r =
        shell(std::string(KILN_CLI) +
              (nproc == 0 ? " run " : " launch --nproc " + std::to_string(nproc) + " ") + file);
    EXPECT_EQ(r.code, 0) << name << ":\n" << r.output;
    char dir[32];
    std::snprintf(dir, sizeof dir, "step-%09d", kSteps);
    return scratch_.path(name) + "/version_0/checkpoints/" + dir + "/model.safetensors";
  }

  // The PyTorch loop's final weights and buffers in `mode`.
  std::string oracle(const std::string& mode) const {
    std::ostringstream c;
    c << R"({"phase": "train", "mode": ")" << mode << R"(", "norm_momentum": )" << kNormMomentum
      << R"(, "accumulation": )" << kAccumulation << R"(, "batch": )" << kBatch << R"(, "size": )"
      << kSize << R"(, "hidden": )" << kHidden << R"(, "lr": )" << kLr << R"(, "momentum": )"
      << kMomentum << R"(, "mean": )" << kMean << R"(, "std": )" << kStd << "}";
    scratch_.write_text("config.json", c.str());
    scratch_.run("norm_accumulation_train.py");
    const std::string path = scratch_.path("oracle_" + mode + ".safetensors");
    EXPECT_EQ(std::rename(scratch_.path("oracle.safetensors").c_str(), path.c_str()), 0);
    return path;
  }

  // For each pair of safetensors files: the largest difference of the running statistics and
  // of the other tensors.
  struct Diff {
    double stats, weights;
  };
  std::vector<Diff> diffs(const std::vector<std::pair<std::string, std::string>>& pairs) const {
    std::string list;
    for (const auto& [a, b] : pairs) {
      list += (list.empty() ? "" : ", ") + std::string("[\"") + a + "\", \"" + b + "\"]";
    }
    scratch_.write_text("config.json", R"({"phase": "compare", "pairs": [)" + list + "]}");
    scratch_.run("norm_accumulation_train.py");
    const std::string json = scratch_.read_text("diffs.json");
    const std::regex re(R"(\{"stats": ([^,]+), "weights": ([^}]+)\})");
    std::vector<Diff> out;
    for (auto it = std::sregex_iterator(json.begin(), json.end(), re); it != std::sregex_iterator();
         ++it) {
      out.push_back({std::stod((*it)[1]), std::stod((*it)[2])});
    }
    EXPECT_EQ(out.size(), pairs.size()) << json;
    out.resize(pairs.size(), Diff{1e9, 1e9});
    return out;
  }

  kiln::test::Scratch scratch_;
};

TEST_F(NormAccumulationRun, EveryModeMatchesThePyTorchLoopOnOneAndTwoRanks) {
  std::vector<std::pair<std::string, std::string>> pairs;
  std::vector<std::string> what;
  for (const char* mode : {"micro_batch", "adjusted_momentum", "pooled_window"}) {
    const std::string m = mode;
    pipeline("bn1_" + m, "batchnorm", m);
    pipeline("sync2_" + m, "syncbn", m);
    const std::string expected = oracle(m);
    pairs.push_back({run("bn1_" + m, 0), expected});
    what.push_back("batchnorm, one process, " + m);
    pairs.push_back({run("sync2_" + m, 2), expected});
    what.push_back("syncbn, two ranks, " + m);
  }
  // The comparison can fail: the modes end at other running statistics (and the same weights:
  // training normalises with batch statistics whatever the mode).
  pairs.push_back({scratch_.path("oracle_micro_batch.safetensors"),
                   scratch_.path("oracle_pooled_window.safetensors")});
  pairs.push_back({scratch_.path("oracle_adjusted_momentum.safetensors"),
                   scratch_.path("oracle_pooled_window.safetensors")});
  const std::vector<Diff> d = diffs(pairs);
  for (size_t i = 0; i < what.size(); ++i) {
    EXPECT_LT(d[i].stats, kTolerance) << what[i];
    EXPECT_LT(d[i].weights, kTolerance) << what[i];
  }
  EXPECT_GT(d[what.size()].stats, 1e-2) << "micro_batch vs pooled_window";
  EXPECT_GT(d[what.size() + 1].stats, 1e-3) << "adjusted_momentum vs pooled_window";
  EXPECT_LT(d[what.size()].weights, kTolerance);
}

TEST_F(NormAccumulationRun, PooledWindowCountsRecomputedForwardsOnce) {
  // Activation checkpointing runs each segment's forward again in backward.
  pipeline("sqrt", "batchnorm", "pooled_window", "[memory]\ncheckpoint = \"sqrt\"\n");
  const std::string got = run("sqrt", 0);
  const std::vector<Diff> d = diffs({{got, oracle("pooled_window")}});
  EXPECT_LT(d[0].stats, kTolerance);
  EXPECT_LT(d[0].weights, kTolerance);
}

TEST_F(NormAccumulationRun, AnUnknownModeIsAConfigurationError) {
  const std::string file = pipeline("bad", "batchnorm", "per_step");
  const std::string text = scratch_.read_text("bad.toml");
  const std::string key = "running_stats_update = ";
  const size_t at = text.find(key);
  const size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + at, '\n'));
  const size_t column = at - text.rfind('\n', at) + key.size();  // 1-based, at the value
  const Result r = shell(std::string(KILN_CLI) + " validate " + file);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(file + ":" + std::to_string(line) + ":" + std::to_string(column) +
                          ": norm.running_stats_update: 'per_step' is not one of: micro_batch, "
                          "adjusted_momentum, pooled_window"),
            std::string::npos)
      << r.output;
}

}  // namespace
