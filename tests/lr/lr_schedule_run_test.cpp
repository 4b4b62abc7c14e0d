// `kiln lr-schedule` and `kiln plan` describe the schedule the run trains with: the same frame
// (engine::schedule_frame) under gradient accumulation, linear lr scaling and a warm-up and
// milestones in epochs. A real (small, synthetic) run's per-step lr from its metrics file is
// compared with every row of `kiln lr-schedule --csv`, and both with the closed form.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "kiln_test_paths.h"
#include "scratch.hpp"

namespace {

struct Result {
  int code;
  std::string out;  // stdout
  std::string all;  // stdout and stderr, for failure messages
};

Result kiln(const std::string& args, const kiln::test::Scratch& dir) {
  const std::string err = dir.path("stderr.txt");
  FILE* pipe = popen((KILN_CLI " " + args + " 2>" + err).c_str(), "r");
  std::string out;
  std::array<char, 4096> buffer{};
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) out.append(buffer.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, out + dir.read_text("stderr.txt")};
}

std::vector<double> split_numbers(const std::string& text, char separator) {
  std::vector<double> out;
  std::stringstream in(text);
  for (std::string cell; std::getline(in, cell, separator);) out.push_back(std::stod(cell));
  return out;
}

// 200 samples in micro-batches of 16: 13 batches an epoch, in windows of 2: 7 optimizer steps
// an epoch (the last window has one batch), 21 in 3 epochs. Effective batch 32, base_batch 8:
// base lr 0.05 × 4 = 0.2. Warm-up 1.5 epochs = round(10.5) = 11 steps; the milestone after
// epoch 2 makes step 15 (the first of epoch 3) the first at 0.02. Biases train at twice the lr.
const char* kPipeline = R"([run]
device = "cpu"
epochs = 3
seed = 1
log_interval = 5
accumulation_steps = 2
eval = false
checkpoints = false
tensorboard = false
[data]
dataset = "synthetic"
synthetic_train = 200
synthetic_test = 64
batch_size = 16
workers = 0
[model]
name = "mlp"
hidden = [16]
[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9
bias_double_lr = true
[lr_policy]
name = "multistep"
milestones = [2]
by_epoch = true
warmup = "linear"
warmup_epochs = 1.5
[lr_scaling]
base_batch = 8
[precision]
name = "fp32"
)";

// Pet's linear warm-up over 11 steps to 0.2 from 0.1 × 0.2, then 0.2, and 0.02 from step 15.
double expected_lr(int step) {
  if (step <= 11) return 0.2 * (0.1 * (1.0 - step / 11.0) + step / 11.0);
  return step < 15 ? 0.2 : 0.02;
}

TEST(LrScheduleMatchesTheRun, UnderAccumulationScalingAndEpochWarmup) {
  kiln::test::Scratch dir;
  dir.write_text("p.toml", kPipeline);
  const std::string pipeline = dir.path("p.toml");
  const std::string out_dir = " --set run.output_dir='\"" + dir.path("out") + "\"'";

  const Result table = kiln("lr-schedule " + pipeline + " --csv" + out_dir, dir);
  ASSERT_EQ(table.code, 0) << table.all;
  std::istringstream rows_in(table.out);
  std::string header;
  std::getline(rows_in, header);
  EXPECT_EQ(header, "iter,default,bias");
  std::vector<std::vector<double>> rows;
  for (std::string row; std::getline(rows_in, row);) rows.push_back(split_numbers(row, ','));

  const Result run = kiln("run " + pipeline + out_dir + " --metrics " + dir.path("m.jsonl"), dir);
  ASSERT_EQ(run.code, 0) << run.all;
  const std::regex lr_re(R"(\{"type":"step","step":(\d+),.*"lr":\[([^\]]*)\])");
  std::vector<std::vector<double>> steps;
  std::istringstream metrics(dir.read_text("m.jsonl"));
  std::smatch m;
  for (std::string line; std::getline(metrics, line);) {
    if (!std::regex_search(line, m, lr_re)) continue;
    EXPECT_EQ(std::stoul(m[1]), steps.size() + 1) << line;
    steps.push_back(split_numbers(m[2], ','));
  }

  ASSERT_EQ(steps.size(), 21u) << run.all;
  ASSERT_EQ(rows.size(), steps.size()) << table.out;
  for (size_t i = 0; i < steps.size(); ++i) {
    const int step = static_cast<int>(i + 1);
    ASSERT_EQ(rows[i].size(), 3u);
    ASSERT_EQ(steps[i].size(), 2u);
    EXPECT_EQ(rows[i][0], step);
    for (size_t g = 0; g < 2; ++g) {
      EXPECT_DOUBLE_EQ(rows[i][g + 1], steps[i][g]) << "step " << step << " group " << g;
      EXPECT_NEAR(steps[i][g], (g + 1) * expected_lr(step), 1e-15) << "step " << step;
    }
  }

  const Result plan = kiln("plan " + pipeline + out_dir, dir);
  ASSERT_EQ(plan.code, 0) << plan.all;
  for (const char* line :
       {"# parameter groups (lr = schedule lr x scale; base lr 0.2, linearly scaled)\n",
        "#   default    2 tensors, 12704 elements, lr 0.2 (x1)",
        "# batch: 32 per step = batch_size 16 (global: split over the ranks of a distributed run) "
        "x accumulation 2\n",
        "# schedule: 21 optimizer steps, 7 per epoch (13 batches in windows of 2); linear warm-up "
        "over steps 1-11\n"}) {
    EXPECT_NE(plan.out.find(line), std::string::npos) << line << "\n" << plan.out;
  }
}

}  // namespace

namespace {

// A policy that reacts to evaluations (plateau): `kiln lr-schedule` says so, shows the rates of
// a run whose evaluations change nothing, and with --metrics replays a real run's evaluations,
// giving that run's rate at every step (the lowerings after the stalled evaluations of steps 16
// and 24 included).
TEST(LrScheduleMatchesTheRun, APlateauPolicyReplaysTheRunsEvaluations) {
  kiln::test::Scratch dir;
  const std::string pipeline =
      std::string(KILN_SOURCE_DIR) + "/tests/pipelines/synthetic_mlp_plateau.toml";
  const std::string args =
      " --set data.synthetic_train=512 --set run.output_dir='\"" + dir.path("out") + "\"'";
  const Result run = kiln("run " + pipeline + args + " --metrics " + dir.path("m.jsonl"), dir);
  ASSERT_EQ(run.code, 0) << run.all;
  const std::regex lr_re(R"(\{"type":"step","step":(\d+),.*"lr":\[([^\]]*)\])");
  std::vector<std::vector<double>> steps;
  std::istringstream metrics(dir.read_text("m.jsonl"));
  std::smatch m;
  for (std::string line; std::getline(metrics, line);) {
    if (std::regex_search(line, m, lr_re)) steps.push_back(split_numbers(m[2], ','));
  }
  ASSERT_EQ(steps.size(), 32u) << run.all;  // 4 epochs of 8 steps
  EXPECT_DOUBLE_EQ(steps[16][0], 0.025);    // step 17, after the evaluation of step 16
  EXPECT_DOUBLE_EQ(steps[24][0], 0.0125);   // step 25

  const Result plain = kiln("lr-schedule " + pipeline + " --csv" + args, dir);
  ASSERT_EQ(plain.code, 0) << plain.all;
  EXPECT_NE(plain.all.find("# lr_policy 'plateau' reacts to evaluations: these rates are those "
                           "of a run whose evaluations never change them"),
            std::string::npos)
      << plain.all;
  const Result replayed =
      kiln("lr-schedule " + pipeline + " --csv --metrics " + dir.path("m.jsonl") + args, dir);
  ASSERT_EQ(replayed.code, 0) << replayed.all;
  EXPECT_NE(replayed.all.find("# lr_policy 'plateau' reacts to evaluations: 4 replayed from "),
            std::string::npos)
      << replayed.all;
  std::istringstream plain_rows(plain.out), rows(replayed.out);
  std::string header, plain_row;
  std::getline(rows, header);
  std::getline(plain_rows, plain_row);
  size_t i = 0;
  for (std::string row; std::getline(rows, row) && std::getline(plain_rows, plain_row); ++i) {
    ASSERT_LT(i, steps.size());
    const std::vector<double> cells = split_numbers(row, ','),
                              plain_cells = split_numbers(plain_row, ',');
    for (size_t g = 0; g < steps[i].size(); ++g) {
      EXPECT_DOUBLE_EQ(cells[g + 1], steps[i][g]) << "step " << i + 1 << " group " << g;
    }
    // Without the evaluations the rate is never lowered: the warm-up, then 0.05.
    if (i >= 5) {
      EXPECT_DOUBLE_EQ(plain_cells[1], 0.05) << "step " << i + 1;
    }
  }
  EXPECT_EQ(i, steps.size());
  const Result plan = kiln("plan " + pipeline + args, dir);
  ASSERT_EQ(plan.code, 0) << plan.all;
  EXPECT_NE(plan.out.find("# lr_policy plateau reacts to evaluations: the rate after warm-up "
                          "follows them"),
            std::string::npos)
      << plan.out;
}

}  // namespace
