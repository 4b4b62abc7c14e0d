// The optimizers of ABI 1.14 through `kiln run`, each against its reference in a PyTorch loop
// over the same data and initial weights (tests/oracle/optimizer_train.py): step losses,
// evaluations and final weights.
// - SAM and ASAM (re-evaluation, wrapping sgd) against pytorch_optimizer.SAM, with one
//   re-evaluation counted per step in the metrics;
// - Lookahead over a third party's plain-C optimizer (tests/plugins/good_c_optimizer.c) and over
//   adamw, against pytorch_optimizer.Lookahead;
// - Schedule-Free SGD and AdamW, whose evaluations and `kiln export` use x, against schedulefree;
// - Muon on the hidden weights and AdamW on the rest ([[optimizer.partition]]) against
//   torch.optim.Muon and AdamW on the same parameters;
// - L-BFGS without and with its strong-Wolfe line search against torch.optim.LBFGS stepped with a
//   closure, with as many re-evaluations per step as torch's closure calls less its first;
// and the configuration errors of [optimizer.inner] and [[optimizer.partition]].
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

// 100 training samples in batches of 32: 4 steps an epoch (the last of 4 samples), 8 in all.
constexpr int kTrain = 100, kTest = 40, kSize = 6, kSeed = 5, kSteps = 8;
constexpr double kMean = 0.3, kStd = 0.3;
const char* kHidden = "[12, 10]";

class OptimizerRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new kiln::test::Scratch();
    std::ostringstream c;
    c << R"({"phase": "prepare", "seed": )" << kSeed << R"(, "train": )" << kTrain
      << R"(, "test": )" << kTest << R"(, "size": )" << kSize << R"(, "hidden": )" << kHidden
      << "}";
    scratch_->write_text("config.json", c.str());
    scratch_->run("optimizer_train.py");
  }
  static void TearDownTestSuite() {
    delete scratch_;
    scratch_ = nullptr;
  }

  // A pipeline `name` over the prepared data with `optimizer` as its [optimizer] table's body
  // (and any tables after it), lr and weight decay given.
  static std::string pipeline(const std::string& name, const std::string& optimizer,
                              const std::string& extra = "") {
    std::ostringstream t;
    t << "[run]\ndevice = \"cpu\"\nseed = 1\nepochs = 2\nlog_interval = 1\ntensorboard = false\n"
      << "threads = 1\noutput_dir = \"" << scratch_->path(name) << "\"\n"
      << "[data]\ndataset = \"fashion-mnist\"\nroot = \"" << scratch_->path("") << "\"\n"
      << "batch_size = 32\neval_batch_size = 16\nworkers = 0\nshuffle = false\n"
      << "mean = " << kMean << "\nstd = " << kStd << "\n"
      << "[model]\nname = \"mlp\"\nhidden = " << kHidden << "\ninit = \""
      << scratch_->path("mlp.safetensors") << "\"\n"
      << "[lr_policy]\nname = \"constant\"\n"
      << "[plugins]\npaths = [\"" << KILN_TEST_PLUGIN_DIR << "/good\"]\n"
      << "[optimizer]\n"
      << optimizer << extra;
    scratch_->write_text(name + ".toml", t.str());
    return scratch_->path(name + ".toml");
  }

  static Result run(const std::string& name) {
    return shell(std::string(KILN_CLI) + " run " + scratch_->path(name + ".toml") + " --metrics " +
                 scratch_->path(name + ".jsonl"));
  }

  static double number(const std::string& report, const std::string& key) {
    std::smatch m;
    const std::regex re("\"" + key + "\": ([-0-9.e+]+)");
    return std::regex_search(report, m, re) ? std::stod(m[1]) : 1e9;
  }

  // Runs `name` and replays it with the reference `optimizer_json`; the report.
  static std::string compare(const std::string& name, const std::string& optimizer_json, double lr,
                             double weight_decay, const std::string& exported = "",
                             bool autocast = false) {
    const Result r = run(name);
    EXPECT_EQ(r.code, 0) << r.output;
    std::ostringstream c;
    c.precision(17);
    c << R"({"phase": "compare", "optimizer": )" << optimizer_json << R"(, "lr": )" << lr
      << R"(, "weight_decay": )" << weight_decay << R"(, "epochs": 2, "batch": 32, "size": )"
      << kSize << R"(, "hidden": )" << kHidden << R"(, "mean": )" << kMean << R"(, "std": )" << kStd
      << R"(, "metrics": ")" << scratch_->path(name + ".jsonl") << R"(", "checkpoints": ")"
      << scratch_->path(name + "/version_0/checkpoints") << "\"";
    if (autocast) c << R"(, "autocast": true)";
    if (!exported.empty()) {
      const Result e = shell(std::string(KILN_CLI) + " export " + scratch_->path(name) + " --to " +
                             scratch_->path(exported));
      EXPECT_EQ(e.code, 0) << e.output;
      c << R"(, "export": ")" << scratch_->path(exported) << "\"";
    }
    c << "}";
    scratch_->write_text("config.json", c.str());
    scratch_->run("optimizer_train.py");
    const std::string report = scratch_->read_text("report.json");
    EXPECT_EQ(number(report, "steps"), kSteps) << report;
    EXPECT_EQ(number(report, "expected_steps"), kSteps) << report;
    EXPECT_EQ(number(report, "evals"), 2) << report;
    return report;
  }

  // Every step's loss and each evaluation as the reference's, and the final weights: the same
  // float32 operations in another order agree to about 1e-6 over 8 steps.
  static void expect_reference(const std::string& report, double tolerance = 1e-5) {
    EXPECT_LE(number(report, "step_loss"), tolerance) << report;
    EXPECT_LE(number(report, "eval_loss"), tolerance) << report;
    EXPECT_LE(number(report, "accuracy"), 1e-6) << report;
    EXPECT_LE(number(report, "weights"), tolerance) << report;
  }

  static kiln::test::Scratch* scratch_;
};

kiln::test::Scratch* OptimizerRun::scratch_ = nullptr;

TEST_F(OptimizerRun, SamEqualsPytorchOptimizerSamWithOneReevaluationPerStep) {
  pipeline("sam", "name = \"sam\"\nlr = 0.2\nweight_decay = 0.001\nrho = 0.1\n",
           "[optimizer.inner]\nname = \"sgd\"\nmomentum = 0.9\n");
  const std::string report =
      compare("sam", R"({"kind": "sam", "rho": 0.1, "momentum": 0.9})", 0.2, 0.001);
  expect_reference(report);
  EXPECT_EQ(number(report, "reevaluations"), kSteps) << report;
}

// Under bf16 autocast (forward and loss in bfloat16, weights and state float32) against the same
// loop under torch.autocast: the re-evaluation runs under autocast too.
TEST_F(OptimizerRun, SamUnderBf16AutocastEqualsPytorchOptimizerUnderAutocast) {
  pipeline("sam_bf16", "name = \"sam\"\nlr = 0.2\nrho = 0.1\n",
           "[optimizer.inner]\nname = \"sgd\"\nmomentum = 0.9\n[precision]\nname = \"bf16\"\n");
  const std::string report = compare("sam_bf16", R"({"kind": "sam", "rho": 0.1, "momentum": 0.9})",
                                     0.2, 0.0, "", /*autocast=*/true);
  expect_reference(report);
  EXPECT_EQ(number(report, "reevaluations"), kSteps) << report;
}

TEST_F(OptimizerRun, ScheduleFreeAdamwUnderBf16AutocastEqualsSchedulefreeUnderAutocast) {
  pipeline("sf_bf16", "name = \"adamw_schedulefree\"\nlr = 0.02\nweight_decay = 0.01\n",
           "[precision]\nname = \"bf16\"\n");
  const std::string report =
      compare("sf_bf16", R"({"kind": "adamw_schedulefree", "warmup_steps": 0})", 0.02, 0.01, "",
              /*autocast=*/true);
  expect_reference(report);
  EXPECT_LE(number(report, "eval_weights"), 1e-5) << report;
}

TEST_F(OptimizerRun, AsamEqualsPytorchOptimizerAdaptiveSam) {
  pipeline("asam", "name = \"asam\"\nlr = 0.2\nrho = 0.5\n",
           "[optimizer.inner]\nname = \"sgd\"\nmomentum = 0.9\n");
  expect_reference(compare("asam", R"({"kind": "asam", "rho": 0.5, "momentum": 0.9})", 0.2, 0.0));
}

TEST_F(OptimizerRun, LookaheadOverAThirdPartyPlainCOptimizerEqualsPytorchOptimizer) {
  pipeline("la_c", "name = \"lookahead\"\nlr = 0.3\nweight_decay = 0.01\nk = 3\nalpha = 0.4\n",
           "[optimizer.inner]\nname = \"c_sgd\"\n");
  expect_reference(
      compare("la_c", R"({"kind": "lookahead_sgd", "k": 3, "alpha": 0.4})", 0.3, 0.01));
}

TEST_F(OptimizerRun, LookaheadOverAdamwEqualsPytorchOptimizer) {
  pipeline("la_adamw", "name = \"lookahead\"\nlr = 0.01\nweight_decay = 0.01\nk = 2\n",
           "[optimizer.inner]\nname = \"adamw\"\n");
  expect_reference(
      compare("la_adamw", R"({"kind": "lookahead_adamw", "k": 2, "alpha": 0.5})", 0.01, 0.01));
}

// Evaluations, the checkpoint's eval/ tensors and `kiln export` are x, not the y it trains.
TEST_F(OptimizerRun, ScheduleFreeSgdEvaluatesAndExportsXAsSchedulefree) {
  pipeline("sf_sgd",
           "name = \"sgd_schedulefree\"\nlr = 0.5\nweight_decay = 0.001\n"
           "momentum = 0.9\nwarmup_steps = 3\n");
  const std::string report =
      compare("sf_sgd", R"({"kind": "sgd_schedulefree", "momentum": 0.9, "warmup_steps": 3})", 0.5,
              0.001, "sf_sgd.safetensors");
  expect_reference(report);
  EXPECT_EQ(number(report, "eval_tensors"), 6) << report;
  EXPECT_LE(number(report, "eval_weights"), 1e-5) << report;
  EXPECT_LE(number(report, "export"), 1e-5) << report;
  EXPECT_GE(number(report, "x_minus_y"), 1e-3) << report;
}

TEST_F(OptimizerRun, ScheduleFreeAdamwEvaluatesAtXAsSchedulefree) {
  pipeline("sf_adamw",
           "name = \"adamw_schedulefree\"\nlr = 0.02\nweight_decay = 0.01\n"
           "warmup_steps = 2\n");
  const std::string report =
      compare("sf_adamw", R"({"kind": "adamw_schedulefree", "warmup_steps": 2})", 0.02, 0.01);
  expect_reference(report);
  EXPECT_LE(number(report, "eval_weights"), 1e-5) << report;
  EXPECT_GE(number(report, "x_minus_y"), 1e-3) << report;
}

TEST_F(OptimizerRun, MuonOnHiddenWeightsAndAdamwOnTheRestEqualTorch) {
  pipeline("muon", "name = \"adamw\"\nlr = 0.01\nweight_decay = 0.01\n",
           "[[optimizer.partition]]\nname = \"muon\"\nmin_rank = 2\nmatch = \"^layers\\\\.\"\n"
           "lr_mult = 2.0\n");
  const Result plan = shell(std::string(KILN_CLI) + " plan " + scratch_->path("muon.toml"));
  EXPECT_EQ(plan.code, 0) << plan.output;
  EXPECT_NE(plan.output.find("layers.0.linear.weight 12x36 -> muon (default/muon)"),
            std::string::npos)
      << plan.output;
  EXPECT_NE(plan.output.find("head.weight 10x10 -> adamw (default)"), std::string::npos)
      << plan.output;
  // The memory table counts each part's state with its own optimizer's.
  EXPECT_NE(plan.output.find("static memory in MiB with optimizer adamw + muon"), std::string::npos)
      << plan.output;
  // AdamW: 132 values x (exp_avg + exp_avg_sq) + 4 step counters; Muon: 552 values x its
  // momentum buffer. 3280 bytes = 0.003 MiB, where AdamW's state for all 684 values would be
  // 0.005.
  const size_t row = plan.output.find("# * fp32");
  ASSERT_NE(row, std::string::npos) << plan.output;
  std::istringstream fields(plan.output.substr(row + 8));
  double weights = 0, grads = 0, masters = 0, optimizer = 0;
  fields >> weights >> grads >> masters >> optimizer;
  EXPECT_DOUBLE_EQ(optimizer, 0.003) << plan.output;
  // torch.optim.Muon runs Newton-Schulz in bfloat16: its rounding, not the order of float32
  // sums, bounds the agreement.
  expect_reference(compare("muon", R"({"kind": "muon_adamw", "muon_lr_mult": 2.0,
                                       "momentum": 0.95})",
                           0.01, 0.01),
                   1e-4);
}

// torch.optim.LBFGS steps model.parameters() as one vector; Kiln's, the call's groups in their
// order. One group ('.' matches every name) keeps the model's order, so the dot products sum in
// torch's order and the runs agree bit for bit (measured: 0 on the step losses and weights).
// Kiln's default groups (the biases after every weight) sum in another order, which L-BFGS
// amplifies: measured 7e-6 on the weights without a line search, 2.6e-2 with strong Wolfe.
const char* kOneGroup = "[optimizer.custom_keys]\n'.' = { lr_mult = 1.0 }\n";

// Each of the 4 iterations but the last re-evaluates at the weights it moved to; a history of
// 5 pairs wraps around within the run.
TEST_F(OptimizerRun, LbfgsEqualsTorchLbfgsWithoutLineSearch) {
  pipeline("lbfgs", "name = \"lbfgs\"\nlr = 0.2\nmax_iter = 4\nhistory_size = 5\n", kOneGroup);
  const std::string report = compare(
      "lbfgs", R"({"kind": "lbfgs", "max_iter": 4, "history_size": 5, "line_search_fn": "none"})",
      0.2, 0.0);
  expect_reference(report);
  EXPECT_EQ(number(report, "reevaluation_gap"), 0.0) << report;
  EXPECT_EQ(number(report, "reevaluations"), number(report, "expected_reevaluations")) << report;
  EXPECT_EQ(number(report, "reevaluations"), 3 * kSteps) << report;
  // torch's LBFGS has no weight decay and one group: pipelines asking for weight decay, or for
  // groups with different learning rates, are refused at the first step.
  pipeline("lbfgs_wd", "name = \"lbfgs\"\nlr = 0.2\nweight_decay = 0.01\n");
  Result r = run("lbfgs_wd");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("torch.optim.LBFGS has no weight decay"), std::string::npos) << r.output;
  pipeline("lbfgs_lr", "name = \"lbfgs\"\nlr = 0.2\nbias_lr_mult = 2.0\n");
  r = run("lbfgs_lr");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("have different learning rates"), std::string::npos) << r.output;
}

// The strong-Wolfe line search brackets and zooms with the closure: its evaluations, its
// interpolated steps (float32 tensors and Python floats mixed as torch mixes them) and the
// max_eval bound (max_iter * 5 / 4) as torch's.
TEST_F(OptimizerRun, LbfgsEqualsTorchLbfgsWithStrongWolfeLineSearch) {
  pipeline("lbfgs_sw",
           "name = \"lbfgs\"\nlr = 1.0\nmax_iter = 5\nline_search_fn = \"strong_wolfe\"\n",
           kOneGroup);
  const std::string report =
      compare("lbfgs_sw", R"({"kind": "lbfgs", "max_iter": 5, "line_search_fn": "strong_wolfe"})",
              1.0, 0.0);
  expect_reference(report);
  EXPECT_EQ(number(report, "reevaluation_gap"), 0.0) << report;
  EXPECT_EQ(number(report, "reevaluations"), number(report, "expected_reevaluations")) << report;
  EXPECT_GE(number(report, "reevaluations"), kSteps) << report;
}

// A run stopped after step 3 and resumed takes the same steps as one that never stopped: the
// optimizer's state, its inner optimizer's, and the evaluation weights, bit for bit.
TEST_F(OptimizerRun, AResumedRunContinuesEveryOptimizerBitForBit) {
  const struct {
    const char* name;
    const char* optimizer;
    const char* extra;
    int inner;  // checkpointed tensors of the inner optimizer's state
  } cases[] = {
      {"re_sam", "name = \"sam\"\nlr = 0.2\nrho = 0.1\n",
       "[optimizer.inner]\nname = \"sgd\"\nmomentum = 0.9\n", 6},
      {"re_la", "name = \"lookahead\"\nlr = 0.01\nk = 2\n", "[optimizer.inner]\nname = \"adamw\"\n",
       18},
      {"re_sf", "name = \"adamw_schedulefree\"\nlr = 0.02\nwarmup_steps = 2\n", "", 0},
      // The history (a ring of 3 pairs, wrapped by step 3), t, H_diag and the counters.
      {"re_lbfgs",
       "name = \"lbfgs\"\nlr = 1.0\nmax_iter = 5\nhistory_size = 3\n"
       "line_search_fn = \"strong_wolfe\"\n",
       "", 0},
      // Two optimizers' states, each restored to its own (Muon's momentum, AdamW's moments).
      {"re_muon", "name = \"adamw\"\nlr = 0.01\n",
       "[[optimizer.partition]]\nname = \"muon\"\nmin_rank = 2\nmatch = \"^layers\\\\.\"\n", 0},
      {"re_nadam", "name = \"nadam\"\nlr = 0.01\nweight_decay = 0.01\n", "", 0},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string whole = std::string(c.name) + "_whole",
                      halves = std::string(c.name) + "_halves";
    pipeline(whole, c.optimizer, c.extra);
    pipeline(halves, c.optimizer, c.extra);
    Result r = run(whole);
    ASSERT_EQ(r.code, 0) << r.output;
    r = shell(std::string(KILN_CLI) + " run " + scratch_->path(halves + ".toml") + " --metrics " +
              scratch_->path(halves + ".jsonl") + " --set run.max_steps=3");
    ASSERT_EQ(r.code, 0) << r.output;
    r = shell(std::string(KILN_CLI) + " run " + scratch_->path(halves + ".toml") + " --metrics " +
              scratch_->path(halves + ".jsonl") + " --resume auto");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
    std::ostringstream cfg;
    cfg << R"({"phase": "equal", "runs": [)";
    for (const std::string& name : {whole, halves}) {
      cfg << (name == whole ? "" : ", ") << R"({"metrics": ")" << scratch_->path(name + ".jsonl")
          << R"(", "checkpoints": ")" << scratch_->path(name + "/version_0/checkpoints") << "\"}";
    }
    cfg << "]}";
    scratch_->write_text("config.json", cfg.str());
    scratch_->run("optimizer_train.py");
    const std::string report = scratch_->read_text("report.json");
    EXPECT_NE(report.find("\"steps\": [8, 8]"), std::string::npos) << report;
    EXPECT_EQ(number(report, "loss_gap"), 0.0) << report;
    EXPECT_EQ(report.find("\"missing\": [\""), std::string::npos) << report;
    const std::regex gaps("\"gap\": ([-0-9.e+]+)");
    for (auto it = std::sregex_iterator(report.begin(), report.end(), gaps);
         it != std::sregex_iterator(); ++it) {
      EXPECT_EQ(std::stod((*it)[1]), 0.0) << report;
    }
    // The trainer part's count (the model part's comes first, always 0).
    EXPECT_NE(report.find("\"inner\": " + std::to_string(c.inner) + "}}"), std::string::npos)
        << report;
  }
}

// A whole step over more groups than the wrapper has seen before (default, bias and a custom
// group), each with its inner optimizer's state.
TEST_F(OptimizerRun, SamStepsEveryGroupOfAPipeline) {
  pipeline("sam_groups", "name = \"sam\"\nlr = 0.2\nrho = 0.1\n",
           "[optimizer.inner]\nname = \"sgd\"\nmomentum = 0.9\n"
           "[optimizer.custom_keys]\n\"^head\\\\.\" = { lr_mult = 0.5 }\n");
  const Result r = run("sam_groups");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("in 3 group(s)"), std::string::npos) << r.output;
}

TEST_F(OptimizerRun, InnerAndPartitionTablesAreCheckedBeforeAnythingRuns) {
  const auto validate = [](const std::string& name) {
    return shell(std::string(KILN_CLI) + " validate " + scratch_->path(name + ".toml"));
  };
  pipeline("no_inner", "name = \"lookahead\"\nlr = 0.1\n");
  Result r = validate("no_inner");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.name: 'lookahead' steps another optimizer"), std::string::npos)
      << r.output;
  pipeline("stray_inner", "name = \"sgd\"\nlr = 0.1\n", "[optimizer.inner]\nname = \"adamw\"\n");
  r = validate("stray_inner");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.inner: optimizer 'sgd' does not wrap"), std::string::npos)
      << r.output;
  pipeline("bad_inner_key", "name = \"lookahead\"\nlr = 0.1\n",
           "[optimizer.inner]\nname = \"sgd\"\nmomentun = 0.9\n");
  r = validate("bad_inner_key");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.inner.momentun: unknown key; did you mean 'momentum'?"),
            std::string::npos)
      << r.output;
  pipeline("wrapped_wrapper", "name = \"lookahead\"\nlr = 0.1\n",
           "[optimizer.inner]\nname = \"sam\"\n");
  r = validate("wrapped_wrapper");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.inner.name: optimizer 'sam'"), std::string::npos) << r.output;
  pipeline("bad_partition", "name = \"adamw\"\nlr = 0.1\n",
           "[[optimizer.partition]]\nname = \"sgd\"\nmin_rank = -3\n");
  r = validate("bad_partition");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.partition[0].min_rank"), std::string::npos) << r.output;
  pipeline("sam_partition", "name = \"sam\"\nlr = 0.1\n",
           "[optimizer.inner]\nname = \"sgd\"\n[[optimizer.partition]]\nname = \"adamw\"\n");
  r = validate("sam_partition");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("takes the whole step"), std::string::npos) << r.output;
}

}  // namespace
