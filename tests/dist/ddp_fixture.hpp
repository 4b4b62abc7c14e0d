// What the data-parallel tests share: the `kiln` binary run through a shell, a fixture that
// prepares the oracle's data and initial weights (tests/oracle/ddp_train.py) and writes
// pipelines on them, the comparison of two runs' weights, and launches in the background.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "kiln_test_paths.h"
#include "scratch.hpp"

namespace kiln::test::ddp {

struct Result {
  int code;
  std::string output;  // stdout and stderr together
};

inline Result shell(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer{};
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

constexpr int kTrain = 640, kTest = 200, kSize = 12, kSeed = 3;
constexpr double kMean = 0.2, kStd = 0.3, kLr = 0.05, kMomentum = 0.9;
inline const char* kHidden = "[96, 64]";
constexpr double kBucketMb = 0.01;  // small buckets: several per step

class Ddp : public ::testing::Test {
 protected:
  void SetUp() override {
    scratch_.write_text("config.json",
                        R"({"phase": "prepare", "seed": 3, "train": )" + std::to_string(kTrain) +
                            R"(, "test": )" + std::to_string(kTest) + R"(, "size": )" +
                            std::to_string(kSize) + R"(, "hidden": )" + kHidden + "}");
    scratch_.run("ddp_train.py");
  }

  // A pipeline on the prepared data and initial weights; `extra` is appended TOML; `optimizer`
  // (when given) the [optimizer] table's body instead of SGD with momentum.
  std::string pipeline(const std::string& name, int batch, int accumulation, int steps,
                       const std::string& extra = "", const std::string& optimizer = "") const {
    std::ostringstream t;
    t << "[run]\ndevice = \"cpu\"\nseed = 1\nepochs = 1\nmax_steps = " << steps
      << "\naccumulation_steps = " << accumulation << "\ntensorboard = false\noutput_dir = \""
      << scratch_.path(name) << "\"\nthreads = 1\n"
      << "[data]\ndataset = \"fashion-mnist\"\nroot = \"" << scratch_.path("") << "\"\n"
      << "batch_size = " << batch << "\nworkers = 0\nshuffle = false\nmean = " << kMean
      << "\nstd = " << kStd << "\n"
      << "[model]\nname = \"mlp\"\nhidden = " << kHidden << "\ninit = \""
      << scratch_.path("init.safetensors") << "\"\n"
      << "[optimizer]\n"
      << (optimizer.empty() ? "name = \"sgd\"\nlr = " + std::to_string(kLr) +
                                  "\nmomentum = " + std::to_string(kMomentum) + "\n"
                            : optimizer)
      << "[lr_policy]\nname = \"constant\"\n"
      << "[dist]\nbucket_cap_mb = " << kBucketMb << "\n"
      << extra;
    scratch_.write_text(name + ".toml", t.str());
    return scratch_.path(name + ".toml");
  }

  Result run(const std::string& name, int nproc) const {
    const std::string file = scratch_.path(name + ".toml");
    const std::string metrics = " --metrics " + scratch_.path(name + ".jsonl");
    if (nproc == 0) return shell(std::string(KILN_CLI) + " run " + file + metrics);
    return shell(std::string(KILN_CLI) + " launch --nproc " + std::to_string(nproc) + " " + file +
                 metrics);
  }

  // The folder run `name` writes its checkpoints to: its output folder's first run folder (a
  // resumed or restarted run continues in it).
  std::string checkpoint_dir(const std::string& name) const {
    return scratch_.path(name) + "/version_0/checkpoints";
  }

  // The final model weights a run checkpointed.
  std::string weights(const std::string& name, int step) const {
    char dir[32];
    std::snprintf(dir, sizeof dir, "step-%09d", step);
    return checkpoint_dir(name) + "/" + dir + "/model.safetensors";
  }

  double max_diff(const std::string& a, const std::string& b) const {
    scratch_.write_text("config.json",
                        R"({"phase": "compare", "a": ")" + a + R"(", "b": ")" + b + "\"}");
    scratch_.run("ddp_train.py");
    return std::stod(scratch_.read_text("diff.txt"));
  }

  // PyTorch DDP on `world` ranks; its final weights.
  std::string oracle(int world, int batch, int accumulation, int steps) const {
    scratch_.write_text(
        "config.json", R"({"phase": "train", "world": )" + std::to_string(world) +
                           R"(, "batch": )" + std::to_string(batch) + R"(, "accumulation": )" +
                           std::to_string(accumulation) + R"(, "steps": )" + std::to_string(steps) +
                           R"(, "size": )" + std::to_string(kSize) + R"(, "hidden": )" + kHidden +
                           R"(, "lr": )" + std::to_string(kLr) + R"(, "momentum": )" +
                           std::to_string(kMomentum) + R"(, "mean": )" + std::to_string(kMean) +
                           R"(, "std": )" + std::to_string(kStd) + R"(, "bucket_cap_mb": )" +
                           std::to_string(kBucketMb) + R"(, "port": )" +
                           std::to_string(21000 + ::getpid() % 20000) + "}");
    scratch_.run("ddp_train.py");
    return scratch_.path("oracle.safetensors");
  }

  // Per step of a metrics file: the "allreduces" field.
  std::vector<long> allreduces(const std::string& name) const {
    std::ifstream in(scratch_.path(name + ".jsonl"));
    std::vector<long> out;
    const std::regex re(R"("type":"step".*"allreduces":(\d+))");
    std::smatch m;
    for (std::string line; std::getline(in, line);) {
      if (std::regex_search(line, m, re)) out.push_back(std::stol(m[1]));
    }
    return out;
  }

  // Per step of a metrics file: the "grad_norm" field as written (a number or null).
  std::vector<std::string> grad_norms(const std::string& name) const {
    std::ifstream in(scratch_.path(name + ".jsonl"));
    std::vector<std::string> out;
    const std::regex re(R"("type":"step".*"grad_norm":([^,]+),)");
    std::smatch m;
    for (std::string line; std::getline(in, line);) {
      if (std::regex_search(line, m, re)) out.push_back(m[1]);
    }
    return out;
  }

  // The last evaluation line of a metrics file.
  std::string last_eval(const std::string& name) const {
    std::ifstream in(scratch_.path(name + ".jsonl"));
    std::string last;
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"type\":\"eval\"") != std::string::npos) last = line;
    }
    return last;
  }

  kiln::test::Scratch scratch_;
};

// Starts `kiln launch` in the background with its output going to a file; pid of the shell.
struct Background {
  std::string log;
  pid_t pid = -1;
};

inline Background start_launch(const std::string& args, const std::string& log) {
  Background b{log};
  b.pid = fork();
  if (b.pid == 0) {
    const std::string cmd =
        std::string("exec ") + KILN_CLI + " launch " + args + " > " + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return b;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Polls `predicate` every 100 ms for up to `seconds`.
template <typename F>
bool wait_for(F predicate, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (predicate()) return true;
    usleep(100 * 1000);
  }
  return predicate();
}

// Waits for the launcher to end; its exit code (-1 when it did not end in `seconds`).
inline int wait_exit(pid_t pid, double seconds) {
  int status = 0;
  const bool done = wait_for([&] { return waitpid(pid, &status, WNOHANG) == pid; }, seconds);
  if (!done) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The pid `kiln launch` logged for `rank`, once it has.
inline pid_t rank_pid(const std::string& log, int rank) {
  const std::regex re("rank " + std::to_string(rank) + ": pid (\\d+)");
  std::smatch m;
  const std::string text = slurp(log);
  return std::regex_search(text, m, re) ? static_cast<pid_t>(std::stol(m[1])) : -1;
}

}  // namespace kiln::test::ddp
