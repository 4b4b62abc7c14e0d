// Checkpoints and resume through the `kiln` command: kill -9 at a random step and resume gives
// bit-identical weights and optimizer state; a corrupt or truncated newest checkpoint is refused
// by name and the previous one used (or the run stops, as configured); a checkpoint of another
// configuration is refused; SIGTERM writes a checkpoint, exits 143, and the run resumes.
#include "io/checkpoint.hpp"

#include <ATen/Functions.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/filesystem.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "config/pipeline.hpp"
#include "engine/init_weights.hpp"
#include "io/safetensors.hpp"
#include "kiln_test_paths.h"
#include "plugin/adapters.hpp"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/norm_layer.hpp"
#include "shell.hpp"
#include "tensor_scratch.hpp"

namespace fs = boost::filesystem;  // libtorch exports clashing std::filesystem symbols

namespace {

using Result = kiln::test::ShellResult;

// A synthetic run long enough to be interrupted: 64 steps per epoch, 2 epochs, dropout so the
// RNG state matters, one thread so every run computes the same bits.
std::string base_args(const fs::path& out,
                      const std::string& pipeline = std::string(KILN_SOURCE_DIR) +
                                                    "/tests/pipelines/synthetic_mlp.toml") {
  return pipeline + " --set data.synthetic_train=4096 --set model.dropout=0.1 --set run.threads=1" +
         " --set data.workers=1 --set run.tensorboard=false --set run.output_dir=" + out.string();
}

Result kiln_command(const std::string& args) {
  return kiln::test::shell(std::string(KILN_CLI) + " " + args);
}

Result kiln(const std::string& args) { return kiln_command("run " + args); }

// Starts kiln in the background with stdout/stderr to `log`; returns its pid.
pid_t spawn(const std::string& args, const fs::path& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string command =
        "exec " + std::string(KILN_CLI) + " run " + args + " > " + log.string() + " 2>&1";
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Steps recorded so far in a metrics file.
int steps_in(const fs::path& metrics) {
  std::ifstream in(metrics.string());
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) steps += line.find("\"type\":\"step\"") != std::string::npos;
  return steps;
}

void wait_for_steps(const fs::path& metrics, int steps, pid_t pid) {
  for (int i = 0; i < 6000 && steps_in(metrics) < steps; ++i) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, WNOHANG), 0) << "kiln ended before step " << steps;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

fs::path temp_dir() {
  fs::path dir =
      fs::temp_directory_path() / ("kiln_ckpt_" + std::to_string(::getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void expect_same_tensors(const std::string& a, const std::string& b) {
  const auto x = kiln::io::read_safetensors(a), y = kiln::io::read_safetensors(b);
  ASSERT_EQ(x.tensors.size(), y.tensors.size()) << a << " vs " << b;
  for (const auto& [name, t] : x.tensors) {
    const at::Tensor* u = y.find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_TRUE(at::equal(t, *u)) << name << " differs between " << a << " and " << b;
  }
}

// Checkpoint `step` of run folder version_<version> under output folder `out`.
std::string checkpoint_in(const fs::path& out, int version, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%09d", step);
  return (out / ("version_" + std::to_string(version)) / "checkpoints" / name).string();
}

// Checkpoint `step` of the first run in `out` (the one the tests below resume).
std::string final_checkpoint(const fs::path& out, int step) { return checkpoint_in(out, 0, step); }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

size_t files_in(const fs::path& dir) {
  size_t n = 0;
  boost::system::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) ++n;
  return n;
}

// Kills a run with SIGKILL at a random step in [kill_from, 110], resumes it, and requires the
// final checkpoint to equal an uninterrupted run's; `extra` adds options to both runs, and
// `pipeline` is the run's file (128 steps). `metrics` (when not null) receives the killed-and-
// resumed run's metrics lines.
void kill_nine_then_resume_is_bit_identical(
    const std::string& extra, int kill_from = 5,
    const std::string& pipeline = std::string(KILN_SOURCE_DIR) +
                                  "/tests/pipelines/synthetic_mlp.toml",
    std::string* metrics = nullptr) {
  const fs::path dir = temp_dir();
  const std::string every = " --set run.checkpoint_every=1 --set run.checkpoint_keep=2" + extra;
  Result reference = kiln(base_args(dir / "a", pipeline) + every);
  ASSERT_EQ(reference.code, 0) << reference.output;

  std::mt19937 pick(std::random_device{}());
  const int kill_at = std::uniform_int_distribution<int>(kill_from, 110)(pick);
  SCOPED_TRACE("killed at step " + std::to_string(kill_at));
  const pid_t pid =
      spawn(base_args(dir / "b", pipeline) + every + " --metrics " + (dir / "b.jsonl").string(),
            dir / "b.log");
  wait_for_steps(dir / "b.jsonl", kill_at, pid);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));

  Result resumed = kiln(base_args(dir / "b", pipeline) + every + " --resume auto --metrics " +
                        (dir / "b.jsonl").string());
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from "), std::string::npos) << resumed.output;
  for (const char* file : {"/model.safetensors", "/trainer.safetensors"}) {
    expect_same_tensors(final_checkpoint(dir / "a", 128) + file,
                        final_checkpoint(dir / "b", 128) + file);
  }
  // The metrics lines of both runs: whole records, every step there. A step's line is on disk
  // before its checkpoint is written, so a kill between the two repeats that one step at most.
  std::ifstream in((dir / "b.jsonl").string());
  std::set<int> steps;
  int lines = 0;
  const std::regex step_re(R"(\{"type":"step","step":(\d+),.*"allreduces":0\})");
  const std::regex eval_re(R"(\{"type":"eval",.*"loss":[-0-9.e]+,"top5":[-0-9.e]+\})");
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_match(line, eval_re)) continue;
    ++lines;
    ASSERT_TRUE(std::regex_match(line, m, step_re)) << line;
    steps.insert(std::stoi(m[1]));
  }
  EXPECT_EQ(steps.size(), 128u);
  EXPECT_EQ(*steps.begin(), 1);
  EXPECT_EQ(*steps.rbegin(), 128);
  EXPECT_LE(lines, 129);
  if (metrics != nullptr) *metrics = read_bytes((dir / "b.jsonl").string());
  fs::remove_all(dir);
}

// The lr of step `step`'s first group in metrics lines, NaN when there is no such line.
double step_lr(const std::string& metrics, int step) {
  const std::regex re("\\{\"type\":\"step\",\"step\":" + std::to_string(step) +
                      ",.*?\"lr\":\\[([-0-9.e+]+)");
  std::smatch m;
  double lr = std::nan("");
  // The last such line: a step a kill repeated is the resumed run's.
  for (auto it = std::sregex_iterator(metrics.begin(), metrics.end(), re);
       it != std::sregex_iterator(); ++it) {
    lr = std::stod((*it)[1]);
  }
  return lr;
}

TEST(Checkpoint, KillNineAtARandomStepThenResumeIsBitIdentical) {
  kill_nine_then_resume_is_bit_identical("");
}

// ReduceLROnPlateau (lr_policy "plateau") halves the rate after the stalled evaluations of steps
// 64 and 96; killed after the first of them and resumed, the run goes on at the lowered rate,
// with the policy's count of bad evaluations, and ends bit for bit where the uninterrupted run
// does (the policy's state is in every checkpoint, state.toml's lr_state).
TEST(Checkpoint, KillNineAfterAPlateauLoweredTheRateThenResumeIsBitIdentical) {
  std::string metrics;
  kill_nine_then_resume_is_bit_identical(
      " --set data.synthetic_train=2048", 70,
      std::string(KILN_SOURCE_DIR) + "/tests/pipelines/synthetic_mlp_plateau.toml", &metrics);
  EXPECT_DOUBLE_EQ(step_lr(metrics, 64), 0.05) << metrics.substr(0, 2000);
  EXPECT_DOUBLE_EQ(step_lr(metrics, 65), 0.025);
  EXPECT_DOUBLE_EQ(step_lr(metrics, 96), 0.025);
  EXPECT_DOUBLE_EQ(step_lr(metrics, 97), 0.0125);
  EXPECT_DOUBLE_EQ(step_lr(metrics, 128), 0.0125);

  // Without evaluations it could never react: refused at its key, before anything runs.
  const Result refused =
      kiln_command("validate " + std::string(KILN_SOURCE_DIR) +
                   "/tests/pipelines/synthetic_mlp_plateau.toml --set run.eval=false");
  EXPECT_EQ(refused.code, 2) << refused.output;
  EXPECT_NE(refused.output.find("lr_policy.name: 'plateau' reacts to evaluations and needs "
                                "run.eval = true"),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("synthetic_mlp_plateau.toml:"), std::string::npos)
      << refused.output;
}

// The resumed epoch continues with the same crops, flips and mixing as the uninterrupted run.
TEST(Checkpoint, KillNineThenResumeKeepsEveryAugmentationAndMix) {
  kill_nine_then_resume_is_bit_identical(
      " --set data.random_resized_crop=24 --set data.center_crop=24 --set data.random_flip=true"
      " --set data.mixup_alpha=0.4 --set data.cutmix_alpha=1.0 --set data.mix_prob=0.8");
}

// Flips one byte in the middle of `path`.
void corrupt(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const auto middle = f.tellg() / 2;
  f.seekg(middle);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(middle);
  f.write(&c, 1);
}

TEST(Checkpoint, CorruptOrTruncatedNewestIsRefusedByNameAndThePreviousUsed) {
  const fs::path dir = temp_dir();
  const std::string args = base_args(dir) + " --set run.checkpoint_every=10";
  ASSERT_EQ(kiln(args + " --set run.max_steps=30").code, 0);
  corrupt(final_checkpoint(dir, 30) + "/model.safetensors");

  Result stop = kiln(args + " --set run.resume_fallback=stop --resume auto");
  EXPECT_EQ(stop.code, 1) << stop.output;
  EXPECT_NE(stop.output.find(final_checkpoint(dir, 30) +
                             ": model.safetensors fails its CRC-32 check (corrupted)"),
            std::string::npos)
      << stop.output;
  EXPECT_TRUE(fs::exists(final_checkpoint(dir, 20))) << "an older good checkpoint was deleted";

  Result fallback = kiln(args + " --set run.max_steps=40 --resume auto");
  ASSERT_EQ(fallback.code, 0) << fallback.output;
  EXPECT_NE(fallback.output.find("resume: refused " + final_checkpoint(dir, 30)), std::string::npos)
      << fallback.output;
  EXPECT_NE(fallback.output.find("resumed from " + final_checkpoint(dir, 20) + ": step 20"),
            std::string::npos)
      << fallback.output;

  // Truncated: the newest (step 40 now) loses its tail.
  fs::resize_file(final_checkpoint(dir, 40) + "/trainer.safetensors", 1000);
  Result truncated = kiln(args + " --set run.max_steps=50 --resume auto");
  ASSERT_EQ(truncated.code, 0) << truncated.output;
  EXPECT_NE(
      truncated.output.find(final_checkpoint(dir, 40) + ": trainer.safetensors is 1000 bytes"),
      std::string::npos)
      << truncated.output;
  EXPECT_NE(truncated.output.find("resumed from " + final_checkpoint(dir, 30) + ": step 30"),
            std::string::npos)
      << truncated.output;
  fs::remove_all(dir);
}

TEST(Checkpoint, AnotherConfigurationIsRefusedNamingTheKeysThatDiffer) {
  const fs::path dir = temp_dir();
  ASSERT_EQ(kiln(base_args(dir) + " --set run.max_steps=10").code, 0);
  const std::string checkpoint = final_checkpoint(dir, 10);
  Result r = kiln(base_args(dir) + " --set optimizer.lr=0.01 --set 'model.hidden=[32]' --resume " +
                  checkpoint);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find(checkpoint +
                          ": written by another configuration: model.hidden = [32] here, [64] in "
                          "the checkpoint; optimizer.lr = 0.01 here, 0.05 in the checkpoint\n"),
            std::string::npos)
      << r.output;
  // What may change, and the way to a new run from the checkpoint's weights.
  EXPECT_NE(r.output.find("only these keys may change on resume: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("run.epochs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kiln export " + checkpoint +
                          " --to weights.safetensors, then kiln run ... --set "
                          "model.init=weights.safetensors"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(files_in(dir), 1u) << "a refused resume left a run folder behind";

  // Run length, logging and the synthetic set's cache (the same pixels) are not part of the
  // configuration's identity; nor is the path the pipeline file is named by.
  const fs::path copy = dir / "copy.toml";
  fs::copy_file(std::string(KILN_SOURCE_DIR) + "/tests/pipelines/synthetic_mlp.toml", copy);
  Result longer = kiln(base_args(dir, copy.string()) +
                       " --set run.max_steps=20 --set run.log_interval=7 "
                       "--set data.synthetic_cache_mib=0 --resume auto");
  EXPECT_EQ(longer.code, 0) << longer.output;
  EXPECT_NE(longer.output.find("resumed from " + checkpoint), std::string::npos) << longer.output;
  fs::remove_all(dir);
}

// A key the checkpoint does not record (an option added to Kiln since it was written) is no
// difference while it is at its default here: the checkpoint trained with what the default does.
TEST(Checkpoint, AKeyTheCheckpointDoesNotRecordOnlyDiffersAwayFromItsDefault) {
  const fs::path dir = temp_dir();
  ASSERT_EQ(kiln(base_args(dir) + " --set run.max_steps=10").code, 0);
  const std::string state_path = final_checkpoint(dir, 10) + "/state.toml";
  const std::string state = read_bytes(state_path);
  auto without = [&](const std::vector<std::string>& keys) {
    std::string edited = state;
    for (const std::string& key : keys) {
      const size_t from = edited.find("'" + key + "' = ");
      ASSERT_NE(from, std::string::npos) << key << "\n" << state;
      edited.erase(from, edited.find('\n', from) + 1 - from);
    }
    std::ofstream(state_path, std::ios::binary | std::ios::trunc) << edited;
  };
  // model.dropout is 0.1 here (base_args), not its default 0.0: a difference.
  without({"model.norm_layers", "model.dropout"});
  const Result away = kiln(base_args(dir) + " --set run.max_steps=20 --resume auto");
  EXPECT_EQ(away.code, 1) << away.output;
  EXPECT_NE(away.output.find(": written by another configuration: model.dropout = 0.1 here, not "
                             "in the checkpoint\n"),
            std::string::npos)
      << away.output;
  // model.norm_layers is false here, its default: none.
  without({"model.norm_layers"});
  const Result at_default = kiln(base_args(dir) + " --set run.max_steps=20 --resume auto");
  EXPECT_EQ(at_default.code, 0) << at_default.output;
  EXPECT_NE(at_default.output.find("resumed from " + final_checkpoint(dir, 10)), std::string::npos)
      << at_default.output;
  fs::remove_all(dir);
}

// run.checkpoint_best: the checkpoint of the best evaluation so far is kept besides the
// checkpoint_keep newest, named by checkpoints/best and best.toml; `kiln evaluate` of it gives
// that evaluation; a resumed run keeps judging against the recorded best.
TEST(Checkpoint, TheBestCheckpointIsKeptBesidesTheNewest) {
  const fs::path dir = temp_dir();
  // lr 0.5 makes the accuracy fall back in the last epoch (checked below), so the best is not
  // simply the newest.
  const std::string args = std::string(KILN_SOURCE_DIR) +
                           "/tests/pipelines/synthetic_mlp.toml --set run.epochs=5 "
                           "--set optimizer.lr=0.5 --set run.threads=1 --set run.checkpoint_keep=1 "
                           "--set run.checkpoint_best=accuracy --set run.tensorboard=false "
                           "--set run.output_dir=" +
                           dir.string();
  const std::string metrics = (dir / "run.jsonl").string();
  const Result r = kiln(args + " --metrics " + metrics);
  ASSERT_EQ(r.code, 0) << r.output;
  // The evaluations: (step, accuracy, loss); the best is the first of the highest accuracy.
  struct Eval {
    int step;
    double accuracy, loss;
  };
  std::vector<Eval> evals;
  const std::string text = read_bytes(metrics);
  const std::regex eval(
      R"re("type":"eval","epoch":\d+,"step":(\d+),"accuracy":([^,]+),"loss":([^,]+))re");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), eval); it != std::sregex_iterator();
       ++it) {
    evals.push_back({std::stoi((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3])});
  }
  ASSERT_EQ(evals.size(), 5u) << text;
  Eval best = evals[0];
  for (const Eval& e : evals) {
    if (e.accuracy > best.accuracy) best = e;
  }
  ASSERT_LT(best.step, evals.back().step) << "the test needs a best before the last epoch";

  // The newest checkpoint (keep 1) and the best one, the record and the link.
  const fs::path root = dir / "version_0" / "checkpoints";
  const std::string best_dir = checkpoint_in(dir, 0, best.step);
  std::set<std::string> entries;
  for (fs::directory_iterator it(root), end; it != end; ++it) {
    entries.insert(it->path().filename().string());
  }
  EXPECT_EQ(entries, (std::set<std::string>{
                         "best", "best.toml", fs::path(best_dir).filename().string(),
                         fs::path(checkpoint_in(dir, 0, evals.back().step)).filename().string()}));
  EXPECT_EQ(fs::read_symlink(root / "best").string(), fs::path(best_dir).filename().string());
  const std::string record = read_bytes((root / "best.toml").string());
  EXPECT_NE(record.find("metric = 'accuracy'"), std::string::npos) << record;
  EXPECT_NE(record.find("step = " + std::to_string(best.step)), std::string::npos) << record;

  // Evaluating it through the link gives that evaluation.
  const Result e = kiln_command("evaluate " + args + " --checkpoint " + (root / "best").string() +
                                " --metrics " + (dir / "eval.jsonl").string());
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string again = read_bytes((dir / "eval.jsonl").string());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(again, m, eval)) << again;
  EXPECT_EQ(std::stoi(m[1]), best.step);
  EXPECT_EQ(std::stod(m[2]), best.accuracy);
  EXPECT_EQ(std::stod(m[3]), best.loss);

  // Resumed from the best, the run redoes the epochs after it: none beats the recorded best,
  // which stays (and its checkpoint with it).
  const Result resumed = kiln(args + " --resume " + best_dir);
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_EQ(read_bytes((root / "best.toml").string()), record);
  EXPECT_TRUE(fs::is_directory(best_dir));
  EXPECT_EQ(resumed.output.find("best accuracy so far"), std::string::npos) << resumed.output;

  // It needs the evaluations and the checkpoints: refused at its key before the run.
  for (const char* off : {"run.eval=false", "run.checkpoints=false"}) {
    const Result refused = kiln_command("validate " + args + " --set " + off);
    EXPECT_EQ(refused.code, 2) << refused.output;
    EXPECT_NE(refused.output.find("run.checkpoint_best: needs "), std::string::npos)
        << refused.output;
  }
  fs::remove_all(dir);
}

// run.early_stop_patience: the run ends (exit 0, with a checkpoint) at the evaluation that makes
// `patience` in a row without a better loss, as Lightning's EarlyStopping(mode="min",
// min_delta=0) rules (recomputed here from the metrics); resumed, it stays stopped; raising the
// patience trains on.
TEST(Checkpoint, EarlyStopEndsTheRunAndAResumeKeepsItStopped) {
  const fs::path dir = temp_dir();
  constexpr int kPatience = 2, kEpochs = 8, kStepsPerEpoch = 16;
  const std::string args =
      std::string(KILN_SOURCE_DIR) +
      "/tests/pipelines/synthetic_mlp.toml --set run.epochs=" + std::to_string(kEpochs) +
      " --set optimizer.lr=1.0 --set run.threads=1 --set run.checkpoint_best=loss "
      "--set run.early_stop_patience=" +
      std::to_string(kPatience) +
      " --set run.tensorboard=false --set run.output_dir=" + dir.string();
  const std::string metrics = (dir / "run.jsonl").string();
  const Result r = kiln(args + " --metrics " + metrics);
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<std::pair<int, double>> evals;  // step, loss
  const std::string text = read_bytes(metrics);
  const std::regex eval(
      R"re("type":"eval","epoch":\d+,"step":(\d+),"accuracy":[^,]+,"loss":([^,]+))re");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), eval); it != std::sregex_iterator();
       ++it) {
    evals.emplace_back(std::stoi((*it)[1]), std::stod((*it)[2]));
  }
  // Lightning's rule over the same evaluations: where it stops, and the best then.
  double best = INFINITY;
  int best_step = 0, wait = 0;
  size_t stop_at = evals.size();
  std::vector<int> since;
  for (size_t i = 0; i < evals.size(); ++i) {
    if (evals[i].second < best) {
      best = evals[i].second;
      best_step = evals[i].first;
      wait = 0;
      since.clear();
    } else {
      ++wait;
      since.push_back(evals[i].first);
      if (wait >= kPatience) {
        stop_at = i;
        break;
      }
    }
  }
  ASSERT_LT(stop_at, evals.size()) << "Lightning's rule would not stop here:\n" << text;
  EXPECT_EQ(stop_at, evals.size() - 1) << "the run went on after the stop";
  EXPECT_LT(evals.back().first, kEpochs * kStepsPerEpoch) << "the test needs an early stop";
  EXPECT_NE(r.output.find("early stop: " + std::to_string(kPatience) + " evaluation(s)"),
            std::string::npos)
      << r.output;
  const fs::path root = dir / "version_0" / "checkpoints";
  const std::string record = read_bytes((root / "best.toml").string());
  std::string since_text;
  for (size_t i = 0; i < since.size(); ++i)
    since_text += (i ? ", " : "") + std::to_string(since[i]);
  EXPECT_NE(record.find("since = [ " + since_text + " ]"), std::string::npos) << record;
  EXPECT_NE(record.find("step = " + std::to_string(best_step)), std::string::npos) << record;
  EXPECT_TRUE(fs::is_directory(checkpoint_in(dir, 0, evals.back().first)));

  // Resumed with the same patience: stopped before any step.
  const Result again = kiln(args + " --resume auto --metrics " + metrics);
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("early stop: "), std::string::npos) << again.output;
  EXPECT_EQ(read_bytes(metrics), text) << "the resumed run trained or evaluated";
  // A larger patience trains on from there.
  const Result on = kiln(args + " --resume auto --set run.early_stop_patience=100");
  ASSERT_EQ(on.code, 0) << on.output;
  EXPECT_TRUE(fs::is_directory(checkpoint_in(dir, 0, kEpochs * kStepsPerEpoch))) << on.output;

  // It watches checkpoint_best's metric: without one it is refused at its key.
  const Result refused = kiln_command("validate " + args + " --set run.checkpoint_best=none");
  EXPECT_EQ(refused.code, 2) << refused.output;
  EXPECT_NE(refused.output.find("run.early_stop_patience: needs run.checkpoint_best"),
            std::string::npos)
      << refused.output;
  fs::remove_all(dir);
}

// Checkpoints written before they recorded their configuration's keys compare by its hash.
TEST(Checkpoint, ACheckpointWithoutItsKeysIsComparedByItsHash) {
  const fs::path dir = temp_dir();
  ASSERT_EQ(kiln(base_args(dir) + " --set run.max_steps=10").code, 0);
  const std::string state_path = final_checkpoint(dir, 10) + "/state.toml";
  std::string state = read_bytes(state_path);
  const size_t from = state.find("[config]\n");
  ASSERT_NE(from, std::string::npos) << state;
  state.erase(from, state.find("\n[", from) + 1 - from);
  std::ofstream(state_path, std::ios::binary | std::ios::trunc) << state;

  Result other = kiln(base_args(dir) + " --set optimizer.lr=0.01 --resume auto");
  EXPECT_EQ(other.code, 1) << other.output;
  EXPECT_NE(other.output.find(": written by another configuration: its configuration hash is "),
            std::string::npos)
      << other.output;
  Result same = kiln(base_args(dir) + " --set run.max_steps=20 --resume auto");
  EXPECT_EQ(same.code, 0) << same.output;
  EXPECT_NE(same.output.find("resumed from " + final_checkpoint(dir, 10)), std::string::npos)
      << same.output;
  fs::remove_all(dir);
}

// Each run writes into a run folder of its own, <output_dir>/version_<N>, as Lightning's loggers
// do: a fresh run under another configuration never overwrites (or prunes) an earlier run's
// checkpoints; --resume auto continues the newest run, --resume PATH the run PATH lies in; a
// run's TensorBoard events lie beside its checkpoints.
TEST(RunFolders, AFreshRunNeverTouchesAnEarlierRunsCheckpoints) {
  const fs::path dir = temp_dir();
  const std::string tensorboard = " --set run.tensorboard=true";
  ASSERT_EQ(kiln(base_args(dir) + tensorboard + " --set run.max_steps=10").code, 0);
  const std::string first = final_checkpoint(dir, 10);
  const std::string model = read_bytes(first + "/model.safetensors");
  const std::string state = read_bytes(first + "/state.toml");
  ASSERT_FALSE(model.empty());

  Result other =
      kiln(base_args(dir) + tensorboard + " --set optimizer.lr=0.01 --set run.max_steps=10");
  ASSERT_EQ(other.code, 0) << other.output;
  EXPECT_NE(other.output.find("run folder " + (dir / "version_1").string() + " (a new run)"),
            std::string::npos)
      << other.output;
  EXPECT_TRUE(fs::exists(checkpoint_in(dir, 1, 10))) << other.output;
  EXPECT_EQ(read_bytes(first + "/model.safetensors"), model)
      << "a fresh run overwrote an earlier run's checkpoint";
  EXPECT_EQ(read_bytes(first + "/state.toml"), state);

  Result newest = kiln(base_args(dir) + tensorboard +
                       " --set optimizer.lr=0.01 --set run.max_steps=20 --resume auto");
  ASSERT_EQ(newest.code, 0) << newest.output;
  EXPECT_NE(newest.output.find("resumed from " + checkpoint_in(dir, 1, 10) + ": step 10"),
            std::string::npos)
      << newest.output;
  EXPECT_TRUE(fs::exists(checkpoint_in(dir, 1, 20)));
  Result older = kiln(base_args(dir) + tensorboard + " --set run.max_steps=20 --resume " + first);
  ASSERT_EQ(older.code, 0) << older.output;
  EXPECT_TRUE(fs::exists(checkpoint_in(dir, 0, 20)));
  EXPECT_FALSE(fs::exists(dir / "version_2"));
  // One event file per process that ran in the folder.
  EXPECT_EQ(files_in(dir / "version_0" / "tensorboard"), 2u);
  EXPECT_EQ(files_in(dir / "version_1" / "tensorboard"), 2u);
  fs::remove_all(dir);
}

// checkpoints/ directly under the output folder, as Kiln wrote them before run folders.
TEST(RunFolders, ResumeAutoContinuesARunFromBeforeRunFolders) {
  const fs::path dir = temp_dir();
  ASSERT_EQ(kiln(base_args(dir / "new") + " --set run.max_steps=10").code, 0);
  fs::create_directories(dir / "old");
  fs::rename(dir / "new" / "version_0" / "checkpoints", dir / "old" / "checkpoints");
  Result r = kiln(base_args(dir / "old") + " --set run.max_steps=20 --resume auto");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(
      r.output.find("resumed from " + (dir / "old" / "checkpoints" / "step-000000010").string()),
      std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(dir / "old" / "checkpoints" / "step-000000020"));
  EXPECT_FALSE(fs::exists(dir / "old" / "version_0"));
  fs::remove_all(dir);
}

// A folder under checkpoints/ whose name is no step count is skipped with a warning (it used to
// end --resume auto, and a plain run at its first checkpoint, with "error: stoll"); what a
// killed write left (.tmp-step-*) is removed at the next start.
TEST(Checkpoint, AStrayFolderIsSkippedWithAWarningAndPartialWritesAreRemoved) {
  const fs::path dir = temp_dir();
  const std::string args = base_args(dir) + " --set run.checkpoint_every=5";
  ASSERT_EQ(kiln(args + " --set run.max_steps=5").code, 0);
  const fs::path root = dir / "version_0" / "checkpoints";
  const fs::path stray = root / "step-99999999999999999999";
  const fs::path partial = root / ".tmp-step-000000010-4242";
  fs::create_directories(stray);
  fs::create_directories(partial);
  std::ofstream((partial / "model.safetensors").string()) << "half a file";

  Result r = kiln(args + " --set run.max_steps=10 --resume auto");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(stray.string() + ": not a checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from " + final_checkpoint(dir, 5) + ": step 5"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(final_checkpoint(dir, 10))) << r.output;
  EXPECT_FALSE(fs::exists(partial));
  EXPECT_TRUE(fs::exists(stray)) << "not Kiln's to delete";
  fs::remove_all(dir);
}

TEST(Checkpoint, SigtermWritesACheckpointExits143AndTheRunResumes) {
  const fs::path dir = temp_dir();
  // A checkpoint every step slows the run, so the signal lands long before its end.
  const std::string args = base_args(dir / "run") + " --set run.checkpoint_every=1";
  const pid_t pid = spawn(args + " --metrics " + (dir / "m.jsonl").string(), dir / "log");
  wait_for_steps(dir / "m.jsonl", 20, pid);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  std::ifstream log((dir / "log").string());
  const std::string output((std::istreambuf_iterator<char>(log)), {});
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 143) << output;
  EXPECT_NE(output.find("stopped by signal 15 after step"), std::string::npos) << output;
  const int stopped_at = steps_in(dir / "m.jsonl");
  EXPECT_TRUE(fs::exists(final_checkpoint(dir / "run", stopped_at))) << output;

  Result resumed = kiln(args + " --resume auto --metrics " + (dir / "m.jsonl").string());
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_EQ(steps_in(dir / "m.jsonl"), 128);  // appended: every step exactly once
  EXPECT_TRUE(fs::exists(final_checkpoint(dir / "run", 128)));
  fs::remove_all(dir);
}

TEST(Export, PythonLoadsTheWeightsAndItsModelGivesKilnsOutputs) {
  const fs::path dir = temp_dir();
  Result trained = kiln(base_args(dir) + " --set run.max_steps=10");
  ASSERT_EQ(trained.code, 0) << trained.output;
  const std::string weights = (dir / "w.safetensors").string();
  Result exported = kiln_command("export " + final_checkpoint(dir, 10) + " --to " + weights);
  ASSERT_EQ(exported.code, 0) << exported.output;
  Result half = kiln_command("export " + final_checkpoint(dir, 10) + " --to " +
                             (dir / "h.safetensors").string() + " --dtype bf16");
  ASSERT_EQ(half.code, 0) << half.output;
  EXPECT_EQ(kiln::io::read_safetensors((dir / "h.safetensors").string())
                .find("head.weight")
                ->scalar_type(),
            at::kBFloat16);

  // Kiln's model with those weights, built as the trainer builds it.
  kiln::plugin::Registry registry;
  {
    kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
    std::vector<std::string> refused;
    registry = kiln::plugin::load_all(loader, {KILN_PLUGIN_DIR}, refused);
  }
  const kiln::config::Pipeline p = kiln::config::load_pipeline_text(
      "[model]\nname = \"mlp\"\nhidden = [64]\n", "export.toml", {}, registry);
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  input.channels = 1;
  input.height = 28;
  input.width = 28;
  input.num_classes = 10;
  auto model = kiln::plugin::create_model(*p.model.component, p.model.options, input);
  kiln::engine::load_weights(*model, weights);
  model->eval();
  at::manual_seed(4);
  const at::Tensor x = at::randn({5, 1, 28, 28});
  const at::Tensor y = model->forward(x);

  kiln::test::TensorScratch scratch;
  scratch.write("x.bin", x);
  scratch.write_text("config.json",
                     "{\"weights\": \"" + weights + "\", \"input_shape\": [5, 1, 28, 28]}");
  scratch.run("export_mlp.py");
  // The same float32 weights and ops; only summation order may differ: rtol 1e-5.
  EXPECT_LE(kiln::test::closeness(y, scratch.read("y.bin", {5, 10}), 1e-5, 1e-6), 1.0);

  // model.init starts a run from the file: with a negligible lr it evaluates exactly as the
  // trained model did (the same test accuracy and loss, to the printed digits).
  Result init = kiln(base_args(dir / "init") + " --set model.init=" + weights +
                     " --set optimizer.lr=1e-12 --set run.max_steps=1");
  ASSERT_EQ(init.code, 0) << init.output;
  EXPECT_NE(init.output.find("initial weights from " + weights), std::string::npos) << init.output;
  const size_t at = trained.output.find("final test accuracy: ");
  ASSERT_NE(at, std::string::npos) << trained.output;
  const std::string accuracy = trained.output.substr(at, trained.output.find(" after", at) - at);
  EXPECT_NE(init.output.find(accuracy), std::string::npos) << accuracy << "\n" << init.output;
  Result wrong =
      kiln(base_args(dir / "wrong") + " --set model.hidden=[32] --set model.init=" + weights);
  // Weights that do not fit the model are a configuration error at model.init, before a step.
  EXPECT_EQ(wrong.code, 2) << wrong.output;
  EXPECT_EQ(wrong.output.rfind("--set model.init=" + weights + ": model.init: ", 0), 0u)
      << wrong.output;
  EXPECT_NE(
      wrong.output.find("layers.0.linear.weight has 64x784 in the file, the model's is 32x784"),
      std::string::npos)
      << wrong.output;
  fs::remove_all(dir);
}

TEST(TensorBoard, TheReaderFindsEveryScalarARunWrites) {
  const fs::path dir = temp_dir();
  Result r = kiln(std::string(KILN_SOURCE_DIR) + "/tests/pipelines/synthetic_mlp.toml" +
                  " --set run.output_dir=" + dir.string());
  ASSERT_EQ(r.code, 0) << r.output;
  kiln::test::TensorScratch scratch;
  scratch.write_text("config.json",
                     "{\"logdir\": \"" + (dir / "version_0" / "tensorboard").string() + "\"}");
  scratch.run("tensorboard_read.py");
  std::map<std::string, int> per_tag;
  std::istringstream lines(scratch.read_text("scalars.tsv"));
  std::string line;
  while (std::getline(lines, line)) ++per_tag[line.substr(0, line.find('\t'))];
  // 32 steps, 2 evaluations; lr per parameter group ("default" and "bias" for the mlp).
  for (const char* tag : {"train/loss", "lr/default", "lr/bias", "train/loss_scale",
                          "train/skipped_steps", "perf/samples_per_s", "perf/data_time"}) {
    EXPECT_EQ(per_tag[tag], 32) << tag;
  }
  // The norm on the steps that measured it (run.grad_check = "auto", fp32), and the CPU's
  // peak resident set: steps 10, 20, 30 (log_interval 10) and the last one, 32.
  EXPECT_EQ(per_tag["train/grad_norm"], 4);
  EXPECT_EQ(per_tag["perf/memory_mb"], 4);
  EXPECT_EQ(per_tag["eval/accuracy"], 2);
  EXPECT_EQ(per_tag["eval/loss"], 2);
  fs::remove_all(dir);
}

// TensorBoard's events are flushed with every checkpoint: after kill -9 and a resume from it,
// the curves have every step, once (the resumed run's SessionLog START drops what the killed
// run logged after its checkpoint).
TEST(TensorBoard, KillNineAfterACheckpointThenResumeLosesNoStep) {
  const fs::path dir = temp_dir();
  const std::string args =
      base_args(dir / "run") + " --set run.tensorboard=true --set run.checkpoint_every=4";
  const fs::path metrics = dir / "m.jsonl";
  const pid_t pid = spawn(args + " --metrics " + metrics.string(), dir / "log");
  wait_for_steps(metrics, 30, pid);  // on disk with the checkpoint of step 28 or later
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));

  Result resumed = kiln(args + " --resume auto --metrics " + metrics.string());
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  const fs::path logdir = dir / "run" / "version_0" / "tensorboard";
  EXPECT_EQ(files_in(logdir), 2u);
  kiln::test::TensorScratch scratch;
  scratch.write_text("config.json", "{\"logdir\": \"" + logdir.string() + "\"}");
  scratch.run("tensorboard_read.py");
  std::map<std::string, std::vector<int>> steps;
  std::istringstream lines(scratch.read_text("scalars.tsv"));
  for (std::string line; std::getline(lines, line);) {
    const size_t tab = line.find('\t');
    steps[line.substr(0, tab)].push_back(std::stoi(line.substr(tab + 1)));
  }
  std::vector<int> every(128);
  for (int i = 0; i < 128; ++i) every[i] = i + 1;
  for (const char* tag : {"train/loss", "lr/default", "perf/samples_per_s"}) {
    EXPECT_EQ(steps[tag], every) << tag;
  }
  fs::remove_all(dir);
}

// After a resume the ETA is the rate of the steps since the resume times the steps left, not
// the time since the resume spread over every step since the run's beginning.
TEST(Progress, AfterAResumeTheEtaFollowsTheStepsSinceTheResume) {
  const fs::path dir = temp_dir();
  // 20000 epochs of 64 steps: an ETA of many seconds, however fast a step.
  const std::string args = base_args(dir) + " --set run.epochs=20000";
  ASSERT_EQ(kiln(args + " --set run.max_steps=64").code, 0);
  const fs::path metrics = dir / "m.jsonl";
  const pid_t pid = spawn(args +
                              " --set run.log_interval=1 --set run.eval=false"
                              " --set run.checkpoint_every=1000000 --resume auto --metrics " +
                              metrics.string(),
                          dir / "log");
  wait_for_steps(metrics, 120, pid);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  std::ifstream log_file((dir / "log").string());
  const std::string log((std::istreambuf_iterator<char>(log_file)), {});
  ASSERT_TRUE(WIFEXITED(status)) << log;

  // When each step began, in seconds since the resumed run's training began.
  std::map<int, double> started;
  std::ifstream in(metrics.string());
  const std::regex step_re(R"("step":(\d+),.*"started":([-0-9.e]+),)");
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, m, step_re)) started[std::stoi(m[1])] = std::stod(m[2]);
  }
  const int first = 64, total = 20000 * 64;
  ASSERT_EQ(started.begin()->first, first + 1);
  // Checked from step 72 to 112: an ETA from every step since the run's beginning would be at
  // most 48 / 112 of the right one there.
  const std::regex line_re(R"(step (\d+)/(\d+) .* ETA (?:(\d+):)?(\d+):(\d+))");
  int checked = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line_re);
       it != std::sregex_iterator(); ++it) {
    const int step = std::stoi((*it)[1]);
    if (step < first + 8 || step > first + 48) continue;
    ASSERT_EQ(std::stoi((*it)[2]), total);
    ASSERT_TRUE(started.count(step) && started.count(step + 1)) << step;
    const double eta = ((*it)[3].matched ? 3600.0 * std::stoi((*it)[3]) : 0.0) +
                       60.0 * std::stoi((*it)[4]) + std::stoi((*it)[5]);
    // The line is written between step `step` beginning and the next one beginning.
    const double per_step_low = started[step] / (step - first);
    const double per_step_high = started[step + 1] / (step - first);
    EXPECT_GE(eta, 0.7 * per_step_low * (total - step) - 1.0) << (*it).str();
    EXPECT_LE(eta, 1.3 * per_step_high * (total - step) + 1.0) << (*it).str();
    ++checked;
  }
  EXPECT_EQ(checked, 41) << log;
  fs::remove_all(dir);
}

TEST(Checkpoint, AFullDiskIsAClearErrorAndThePreviousCheckpointSurvives) {
  const fs::path dir = temp_dir();
  const std::string args = base_args(dir) + " --set run.checkpoint_every=10";
  ASSERT_EQ(kiln(args + " --set run.max_steps=10").code, 0);
  // A 64 KiB file-size limit makes the next checkpoint's ~200 KB writes fail with EFBIG, as a
  // full disk fails them with ENOSPC (SIGXFSZ ignored, so write() reports the error).
  const std::string command = "trap '' XFSZ; ulimit -f 128; exec " + std::string(KILN_CLI) +
                              " run " + args + " --set run.max_steps=20 --resume auto";
  const auto [code, output] = kiln::test::shell(command);
  EXPECT_EQ(code, 1) << output;
  EXPECT_NE(output.find(final_checkpoint(dir, 20) + ": cannot write checkpoint"), std::string::npos)
      << output;
  EXPECT_NO_THROW(kiln::io::read_checkpoint(final_checkpoint(dir, 10)));
  EXPECT_FALSE(fs::exists(final_checkpoint(dir, 20)));
  fs::remove_all(dir);
}

TEST(Checkpoint, ASecondSignalExitsAtOnce) {
  const fs::path dir = temp_dir();
  const pid_t pid = spawn(
      base_args(dir) + " --set run.checkpoint_every=1 --metrics " + (dir / "m.jsonl").string(),
      dir / "log");
  wait_for_steps(dir / "m.jsonl", 10, pid);
  // The first asks for a checkpoint at the end of the step and a clean exit (which prints
  // "stopped by signal"); the second means "now": _exit(128 + it), nothing printed. Two
  // different signals, so both are delivered (a repeated one may merge while pending); the
  // kernel picks their order, so either may be the second. Sent while the process is stopped,
  // so both are pending together however the test itself is scheduled.
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  ASSERT_EQ(kill(pid, SIGINT), 0);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_TRUE(WEXITSTATUS(status) == 130 || WEXITSTATUS(status) == 143) << WEXITSTATUS(status);
  std::ifstream log((dir / "log").string());
  const std::string output((std::istreambuf_iterator<char>(log)), {});
  EXPECT_EQ(output.find("stopped by signal"), std::string::npos) << output;
  fs::remove_all(dir);
}

}  // namespace
