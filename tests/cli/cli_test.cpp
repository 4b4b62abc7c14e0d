// The `kiln` command end to end: validate, plan, plugins list/describe, real (small) training
// runs with metrics, the plain-C plugin in a pipeline, and the exit codes and messages of bad
// input.
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/filesystem.hpp>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "kiln_cli.hpp"
#include "kiln_test_paths.h"
#include "shell.hpp"

namespace fs = boost::filesystem;  // libtorch exports clashing std::filesystem symbols

namespace {

using Result = kiln::test::ShellResult;

using kiln::test::kiln_cli;
using kiln::test::pipeline;

fs::path temp_dir() {
  fs::path dir =
      fs::temp_directory_path() / ("kiln_cli_" + std::to_string(::getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::create_directories(dir);
  return dir;
}

// Runs without run.output_dir write under ./runs, and each adds a run folder there (a fresh run
// never reuses one): the tests work in a scratch folder, removed at the end.
class ScratchWorkingDirectory : public ::testing::Environment {
 public:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_cli_cwd_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    previous_ = fs::current_path();
    fs::current_path(dir_);
  }
  void TearDown() override {
    fs::current_path(previous_);
    fs::remove_all(dir_);
  }

 private:
  fs::path dir_, previous_;
};
const ::testing::Environment* const kScratchWorkingDirectory =
    ::testing::AddGlobalTestEnvironment(new ScratchWorkingDirectory);

std::string write(const fs::path& path, const std::string& text) {
  std::ofstream(path.string()) << text;
  return path.string();
}

// The quickstart pipeline (configs/quickstart.toml), which reads Debian's Fashion-MNIST: the
// README's set-up installs it; a machine without it (the lent GPU machine) skips these tests.
std::string quickstart() {
  const char* data = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  return fs::exists(data) ? std::string(KILN_SOURCE_DIR) + "/configs/quickstart.toml" : "";
}

#define KILN_NEEDS_QUICKSTART_DATA(path) \
  if ((path).empty()) GTEST_SKIP() << "Fashion-MNIST is not installed (scripts/setup.sh)"

TEST(Cli, ValidatesTheQuickstart) {
  const std::string quickstart_toml = quickstart();
  KILN_NEEDS_QUICKSTART_DATA(quickstart_toml);
  Result r = kiln_cli("validate " + quickstart_toml);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(": ok (model resnet, optimizer sgd, lr_policy step, norm batchnorm, "
                          "precision fp32)"),
            std::string::npos)
      << r.output;
}

// model.norm swaps every norm layer; what the chosen plugin and the model cannot do together is
// refused by validate, before any run, with the reason.
TEST(Cli, ValidateBuildsTheModelWithTheSwappedNormLayers) {
  const std::string quickstart = ::quickstart();
  KILN_NEEDS_QUICKSTART_DATA(quickstart);
  Result relu = kiln_cli("validate " + quickstart + " --set model.norm='\"inplace_abn\"'");
  EXPECT_EQ(relu.code, 2) << relu.output;
  EXPECT_NE(relu.output.find("inplace_abn: relu is not invertible"), std::string::npos)
      << relu.output;
  Result leaky =
      kiln_cli("validate " + quickstart +
               " --set model.norm='\"inplace_abn\"' --set model.activation='\"leaky_relu\"'");
  EXPECT_EQ(leaky.code, 0) << leaky.output;
  EXPECT_NE(leaky.output.find("norm inplace_abn,"), std::string::npos) << leaky.output;
  Result slope =
      kiln_cli("validate " + quickstart +
               " --set model.norm='\"inplace_abn\"' --set model.activation='\"leaky_relu\"'"
               " --set model.activation_param=0.0");
  EXPECT_EQ(slope.code, 2) << slope.output;
  EXPECT_NE(slope.output.find("leaky_relu with slope 0.000000 is not invertible"),
            std::string::npos)
      << slope.output;
}

TEST(Cli, ValidateChecksCheckpointedBlockNames) {
  const std::string quickstart = ::quickstart();
  KILN_NEEDS_QUICKSTART_DATA(quickstart);
  Result typo = kiln_cli("validate " + quickstart + " --set memory.checkpoint='[\"layr2\"]'");
  EXPECT_EQ(typo.code, 2) << typo.output;
  EXPECT_NE(typo.output.find("did you mean 'layer2'?"), std::string::npos) << typo.output;
  Result sqrt = kiln_cli("validate " + quickstart + " --set memory.checkpoint='\"sqrt\"'");
  EXPECT_EQ(sqrt.code, 0) << sqrt.output;
  Result ddp =
      kiln_cli("validate " + quickstart +
               " --set memory.checkpoint='\"sqrt\"' --set dist.find_unused_parameters=true");
  EXPECT_EQ(ddp.code, 2) << ddp.output;
  EXPECT_NE(ddp.output.find("cannot be combined"), std::string::npos) << ddp.output;
}

TEST(Cli, PlanShowsResolvedOptionsAndGroups) {
  Result r = kiln_cli("plan " + pipeline("synthetic_mlp.toml"));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("momentum = 0.9"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dampening = 0.0"), std::string::npos) << r.output;  // a default
  EXPECT_NE(r.output.find("# parameter groups"), std::string::npos) << r.output;
  // mlp hidden [64] on 1x28x28: weights 784*64 + 64*10, biases 64 + 10.
  EXPECT_NE(r.output.find("default    2 tensors, 50816 elements"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bias       2 tensors, 74 elements"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("# batch: 64 per step"), std::string::npos) << r.output;
}

TEST(Cli, PlanShowsPetAndCustomKeyGroups) {
  Result r = kiln_cli("plan " + pipeline("synthetic_mlp.toml") +
                      " --set optimizer.bias_double_lr=true --set optimizer.weight_decay=0.01" +
                      " --set 'optimizer.custom_keys={\"^head\\\\.\"={lr_mult=10}}'");
  EXPECT_EQ(r.code, 0) << r.output;
  // mlp hidden [64]: layers.0.linear.{weight,bias}, head.{weight,bias}.
  EXPECT_NE(r.output.find("default    1 tensors, 50176 elements, lr 0.05 (x1), weight_decay 0.01"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("bias       1 tensors, 64 elements, lr 0.1 (x2), weight_decay 0.01"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("custom_keys[\"^head\\.\"] 2 tensors, 650 elements, lr 0.5 (x10)"),
            std::string::npos)
      << r.output;
}

TEST(Cli, PrintsAndPlotsTheLrSchedule) {
  fs::path dir = temp_dir();
  const std::string png = (dir / "lr.png").string();
  Result r = kiln_cli("lr-schedule " + pipeline("synthetic_mlp.toml") + " --csv --png " + png +
                      " --set optimizer.bias_double_lr=true");
  ASSERT_EQ(r.code, 0) << r.output;
  std::istringstream in(r.output);
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("wrote ", 0) != 0) rows.push_back(line);  // stderr, in any order
  }
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows.front(), "iter,default,bias");
  rows.erase(rows.begin());
  // 2 epochs × 16 steps; linear warm-up over 5 (Pet: 0.05·(0.1·(1−α)+α)), step ×0.1 at 24.
  ASSERT_EQ(rows.size(), 32u) << r.output;
  auto values = [](const std::string& row) {
    std::vector<double> v;
    std::stringstream ss(row);
    for (std::string cell; std::getline(ss, cell, ',');) v.push_back(std::stod(cell));
    return v;
  };
  EXPECT_NEAR(values(rows[0])[1], 0.05 * (0.1 * 0.8 + 0.2), 1e-12);
  EXPECT_NEAR(values(rows[0])[2], 2 * 0.05 * (0.1 * 0.8 + 0.2), 1e-12);
  EXPECT_NEAR(values(rows[10])[1], 0.05, 1e-12);
  EXPECT_NEAR(values(rows[23])[1], 0.005, 1e-12);
  std::ifstream file(png, std::ios::binary);
  char magic[8] = {};
  file.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
  fs::remove_all(dir);
}

TEST(Cli, ListsAndDescribesPlugins) {
  Result list = kiln_cli("plugins list");
  EXPECT_EQ(list.code, 0) << list.output;
  for (const char* name : {"sgd", "step", "cosine", "fp32", "batchnorm", "mlp", "resnet"}) {
    EXPECT_NE(list.output.find(std::string("\n") + name + " "), std::string::npos) << name;
  }
  Result describe = kiln_cli("plugins describe sgd");
  EXPECT_EQ(describe.code, 0) << describe.output;
  EXPECT_NE(describe.output.find("sgd (optimizer)"), std::string::npos) << describe.output;
  EXPECT_NE(describe.output.find("momentum"), std::string::npos) << describe.output;
  EXPECT_NE(describe.output.find("nesterov"), std::string::npos) << describe.output;
  Result unknown = kiln_cli("plugins describe sdg");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.output.find("error: no plugin component named 'sdg'; available: "),
            std::string::npos)
      << unknown.output;
}

TEST(Cli, TrainsAndWritesMetrics) {
  fs::path dir = temp_dir();
  fs::path metrics = dir / "metrics.jsonl";
  Result r = kiln_cli("run " + pipeline("synthetic_mlp.toml") + " --metrics " + metrics.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("samples/s  ETA"), std::string::npos) << r.output;
  std::ifstream in(metrics);
  std::string line;
  int steps = 0, evals = 0;
  double last_accuracy = 0.0, last_started = -1.0;
  const std::regex step_re(
      R"(\{"type":"step","step":(\d+),"epoch":(\d+),"loss":[-0-9.e]+,"lr":\[[-0-9.e,]+\],)"
      R"("lr_groups":\["default","bias"\],"started":([0-9.e+-]+),"step_time":[-0-9.e]+,"data_time":[-0-9.e]+,"samples_per_s":[-0-9.e]+,)"
      R"("loss_scale":1,"grad_norm":(null|[0-9.e+-]+),"skipped":false,"skipped_total":0,)"
      R"("micro_batches":1,"memory_mb":(null|[0-9.e+]+),"tensor_mb":[0-9.e+]+,"tensor_peak_mb":[0-9.e+]+,)"
      R"("activation_mb":[0-9.e+-]+,"allreduces":0\})");
  const std::regex eval_re(
      R"(\{"type":"eval","epoch":(\d+),"step":(\d+),"accuracy":([-0-9.e]+),"loss":[-0-9.e]+,"top5":[-0-9.e]+\})");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, step_re)) {
      ++steps;
      EXPECT_EQ(std::stoi(m[1]), steps);
      // Steps begin one after another, the evaluation's time between epochs included.
      const double started = std::stod(m[3]);
      EXPECT_GT(started, last_started);
      last_started = started;
      // run.grad_check = "auto", fp32 without clipping: the norm on logged steps only
      // (log_interval 10, and the last step).
      const bool logged = steps % 10 == 0 || steps == 32;
      EXPECT_EQ(m[4].str() != "null", logged) << line;
      // The CPU's peak resident set (a system call to read) on the same steps.
      EXPECT_EQ(m[5].str() != "null", logged) << line;
    } else if (std::regex_match(line, m, eval_re)) {
      ++evals;
      last_accuracy = std::stod(m[3]);
    } else {
      ADD_FAILURE() << "unexpected metrics line: " << line;
    }
  }
  EXPECT_EQ(steps, 32);  // 2 epochs x 1024/64
  EXPECT_EQ(evals, 2);
  // Synthetic classes are separable: a working loop learns them well above chance (10%).
  EXPECT_GT(last_accuracy, 0.9) << r.output;
  fs::remove_all(dir);
}

// The norm (and the check of every gradient) on every step: run.grad_check = "every_step", and
// under "auto" wherever the step needs the pass, here dynamic loss scaling (amp in float16; amp's
// CPU default, bfloat16, scales nothing).
// Runs kiln with a pseudo-terminal as its stdout and stderr, as a user at a terminal would;
// returns its exit code and everything it wrote there, escapes included.
Result kiln_at_a_terminal(const std::string& args) {
  int master = -1;
  winsize size{};
  size.ws_col = 120;
  size.ws_row = 40;
  const pid_t pid = forkpty(&master, nullptr, nullptr, &size);
  if (pid == 0) {
    const std::string command = "exec " KILN_CLI " " + args;
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  if (pid < 0) return {-1, "forkpty failed"};
  std::string output;
  std::array<char, 4096> buffer{};
  for (;;) {
    const ssize_t n = read(master, buffer.data(), buffer.size());
    if (n > 0) {
      output.append(buffer.data(), static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EIO once the child has closed its side
    }
  }
  close(master);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// A bar redraw is a write to the terminal, a system call, which costs a small model's step
// more than the call itself (docs/speed.md): the bar is redrawn ten times a second at most,
// not every step, and log lines (checkpoints in the middle of the run here) still start on a
// clean line.
TEST(Cli, TheProgressBarIsRedrawnTenTimesASecondAtMost) {
  const fs::path dir = temp_dir();
  const auto start = std::chrono::steady_clock::now();
  Result r = kiln_at_a_terminal("run " + pipeline("synthetic_mlp.toml") +
                                " --set data.synthetic_train=32768 --set run.epochs=1" +
                                // One thread: beside a parallel ctest, OpenMP's spinning threads
                                // would slow this run a hundredfold.
                                " --set run.threads=1" +
                                " --set run.log_interval=100000 --set run.eval=false" +
                                " --set run.tensorboard=false --set run.checkpoint_every=128" +
                                " --set run.output_dir='\"" + dir.string() + "\"'");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fs::remove_all(dir);
  ASSERT_EQ(r.code, 0) << r.output;
  // Every log line ("[12:34:56] ...") starts the output, a line, or an erased bar's line:
  // the lr lines of the warm-up, the checkpoints, the last step's progress line, the end.
  const std::regex stamp(R"(\[\d\d:\d\d:\d\d\] )");
  int logs = 0, checkpoints = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), stamp);
       it != std::sregex_iterator(); ++it) {
    const size_t at = static_cast<size_t>(it->position());
    ++logs;
    const std::string log_line = r.output.substr(at, r.output.find('\n', at) - at);
    if (log_line.find(" checkpoint ") != std::string::npos) ++checkpoints;
    EXPECT_TRUE(at == 0 || r.output[at - 1] == '\n' ||
                (at >= 4 && r.output.compare(at - 4, 4, "\r\033[K") == 0))
        << "log line " << logs << " follows \"" << r.output.substr(at >= 20 ? at - 20 : 0, 20)
        << "\":\n"
        << r.output;
  }
  EXPECT_NE(r.output.find("step 512/512"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 512 steps"), std::string::npos) << r.output;
  // A draw is "\r", the bar, "\033[K"; an erase is "\r\033[K"; "\r\n" ends a line at a
  // terminal. Ten draws a second, plus one at once after each log line erased the bar.
  int draws = 0;
  for (size_t at = r.output.find('\r'); at != std::string::npos; at = r.output.find('\r', at + 1)) {
    if (r.output.compare(at + 1, 3, "\033[K") != 0 && r.output.compare(at + 1, 1, "\n") != 0) {
      ++draws;
    }
  }
  constexpr int kSteps = 32768 / 64;
  EXPECT_GE(draws, 1) << r.output;
  // Fewer draws than steps, where the run was quick enough for that to tell (a loaded machine
  // may take over 0.1 s a step, and then every step is a draw).
  if (seconds * 10.0 < kSteps / 4.0) {
    EXPECT_LT(draws, kSteps / 4) << r.output;
  }
  EXPECT_LE(draws, 3 + static_cast<int>(seconds * 10.0) + logs) << seconds << " s\n" << r.output;
  EXPECT_GE(checkpoints, 3) << r.output;  // steps 128, 256, 384 (512 is the run's end)
}

TEST(Cli, GradCheckEveryStepOrWhereNeededMeasuresTheNormEveryStep) {
  for (const std::string set :
       {"run.grad_check=every_step", "precision.name=amp --set precision.dtype=fp16"}) {
    SCOPED_TRACE(set);
    fs::path dir = temp_dir();
    fs::path metrics = dir / "metrics.jsonl";
    Result r = kiln_cli("run " + pipeline("synthetic_mlp.toml") + " --set " + set +
                        " --set run.eval=false --metrics " + metrics.string());
    ASSERT_EQ(r.code, 0) << r.output;
    std::ifstream in(metrics);
    std::string line;
    const std::regex norm_re(R"("grad_norm":([0-9.e+-]+),)");
    int steps = 0;
    while (std::getline(in, line)) {
      if (line.find("\"type\":\"step\"") == std::string::npos) continue;
      ++steps;
      std::smatch m;
      ASSERT_TRUE(std::regex_search(line, m, norm_re)) << line;
      EXPECT_GT(std::stod(m[1]), 0.0) << line;
    }
    EXPECT_EQ(steps, 32);
    fs::remove_all(dir);
  }
}

// grad_check = "auto" under data parallelism: two ranks check every step (they agree on a skip
// from the all-reduced gradients); one launched rank has no one to agree with and checks on its
// logged steps only, as `kiln run` does.
TEST(Cli, OneLaunchedRankChecksGradientsAsKilnRunDoes) {
  for (const auto& [command, measured] : std::vector<std::pair<std::string, int>>{
           {"run", 4}, {"launch --nproc 1", 4}, {"launch --nproc 2", 32}}) {
    SCOPED_TRACE(command);
    const fs::path dir = temp_dir();
    const fs::path metrics = dir / "metrics.jsonl";
    Result r =
        kiln_cli(command + " " + pipeline("synthetic_mlp.toml") +
                 " --set run.eval=false --set run.log_interval=8 --metrics " + metrics.string());
    ASSERT_EQ(r.code, 0) << r.output;
    std::ifstream in(metrics.string());
    int steps = 0, norms = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"type\":\"step\"") == std::string::npos) continue;
      ++steps;
      if (std::regex_search(line, std::regex(R"("grad_norm":[0-9])"))) ++norms;
    }
    EXPECT_EQ(steps, 32);
    EXPECT_EQ(norms, measured);
    fs::remove_all(dir);
  }
}

// Each step's loss from a metrics file.
std::vector<double> step_losses(const fs::path& metrics) {
  std::ifstream in(metrics.string());
  std::vector<double> losses;
  const std::regex loss_re(R"("type":"step",.*"loss":([-0-9.e+]+),)");
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, m, loss_re)) losses.push_back(std::stod(m[1]));
  }
  return losses;
}

// model.memory_format = "channels_last" restrides the convolutions' weights and the batches to
// NHWC and trains to the same losses as NCHW (float32: the kernels sum in another order), with
// batch norm and with a plugin norm layer that keeps its own layout (InPlace-ABN). (On the CPU,
// "auto" picks channels_last for this convolutional model: precision_mechanics_test.)
TEST(Cli, ChannelsLastTrainsAsContiguous) {
  fs::path dir = temp_dir();
  for (const std::string norm :
       {"", " --set model.norm='\"inplace_abn\"' --set model.activation='\"leaky_relu\"'"}) {
    std::vector<double> losses[2];
    for (int nhwc = 0; nhwc < 2; ++nhwc) {
      const fs::path metrics = dir / ("m" + std::to_string(nhwc) + ".jsonl");
      Result r = kiln_cli("run " + pipeline("synthetic_resnet.toml") + norm + " --metrics " +
                          metrics.string() + " --set model.memory_format='\"" +
                          (nhwc ? "channels_last" : "contiguous") + "\"'");
      ASSERT_EQ(r.code, 0) << r.output;
      // The stem, four 3x3 convolutions and the shortcut's 1x1 (given channels-last's exact
      // strides, though its contiguous ones read as channels-last too: memory_format.hpp).
      EXPECT_EQ(r.output.find("memory format channels_last: 6 4-D tensors restrided") !=
                    std::string::npos,
                nhwc == 1)
          << r.output;
      losses[nhwc] = step_losses(metrics);
    }
    ASSERT_EQ(losses[0].size(), 6u) << norm;
    ASSERT_EQ(losses[1].size(), 6u) << norm;
    for (size_t i = 0; i < losses[0].size(); ++i) {
      EXPECT_NEAR(losses[1][i], losses[0][i], 1e-5 * losses[0][i]) << norm << " step " << i + 1;
    }
  }
  fs::remove_all(dir);
}

// run.profile_steps: torch's profiler around the chosen optimizer steps, as a Chrome trace with a
// ProfilerStep#N span per step holding that step's ops; a window the run cuts short is saved
// with the steps it covered, one past the run's end writes nothing.
TEST(Cli, ProfilesTheChosenStepsAsAChromeTrace) {
  struct Case {
    int start, steps;
    std::string file;  // expected under profile/; empty: no trace
    int first, last;
  };
  for (const Case& c : {Case{2, 2, "steps_2-3.json", 2, 3}, Case{5, 10, "steps_5-6.json", 5, 6},
                        Case{7, 1, "", 0, 0}}) {
    SCOPED_TRACE("profile_start " + std::to_string(c.start));
    const fs::path dir = temp_dir();
    Result r = kiln_cli("run " + pipeline("synthetic_resnet.toml") + " --set run.output_dir='\"" +
                        dir.string() + "\"' --set run.profile_start=" + std::to_string(c.start) +
                        " --set run.profile_steps=" + std::to_string(c.steps));
    ASSERT_EQ(r.code, 0) << r.output;
    const fs::path traces = dir / "version_0" / "profile";
    if (c.file.empty()) {
      EXPECT_FALSE(fs::exists(traces)) << r.output;
      fs::remove_all(dir);
      continue;
    }
    ASSERT_TRUE(fs::exists(traces / c.file)) << r.output;
    EXPECT_EQ(std::distance(fs::directory_iterator(traces), fs::directory_iterator()), 1);
    const nlohmann::json trace = nlohmann::json::parse(std::ifstream((traces / c.file).string()));
    std::map<int, std::pair<double, double>> spans;  // step -> [ts, ts + dur] (microseconds)
    std::vector<double> convolutions;
    for (const auto& e : trace.at("traceEvents")) {
      const std::string name = e.value("name", "");
      if (name.rfind("ProfilerStep#", 0) == 0) {
        const double ts = e.at("ts").get<double>();
        spans[std::stoi(name.substr(13))] = {ts, ts + e.at("dur").get<double>()};
      } else if (name == "aten::convolution") {
        convolutions.push_back(e.at("ts").get<double>());
      }
    }
    ASSERT_EQ(spans.size(), static_cast<size_t>(c.last - c.first + 1));
    for (int step = c.first; step <= c.last; ++step) {
      ASSERT_EQ(spans.count(step), 1u) << "ProfilerStep#" << step;
      const auto [begin, end] = spans[step];
      const auto inside = std::count_if(convolutions.begin(), convolutions.end(),
                                        [&](double ts) { return ts >= begin && ts <= end; });
      EXPECT_GT(inside, 0) << "no convolution inside step " << step;
    }
    fs::remove_all(dir);
  }
}

// A resumed run traces what is left of the window; the profile keys do not change what training
// computes, so setting them keeps the checkpoint usable.
TEST(Cli, AResumedRunProfilesWhatIsLeftOfTheWindow) {
  const fs::path dir = temp_dir();
  const std::string args = "run " + pipeline("synthetic_resnet.toml") +
                           " --set run.checkpoints=true --set run.checkpoint_every=2"
                           " --set run.output_dir='\"" +
                           dir.string() + "\"'";
  Result first = kiln_cli(args + " --set run.max_steps=4");
  ASSERT_EQ(first.code, 0) << first.output;
  Result resumed =
      kiln_cli(args + " --set run.profile_start=4 --set run.profile_steps=3" + " --resume auto");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("step 4"), std::string::npos) << resumed.output;
  EXPECT_TRUE(fs::exists(dir / "version_0" / "profile" / "steps_5-6.json")) << resumed.output;
  fs::remove_all(dir);
}

// run.cuda_graph where it cannot capture (here: no CUDA device) says why and trains eagerly,
// to the same losses as without it.
TEST(Cli, CudaGraphFallsBackWithAReasonWhereItCannotCapture) {
  fs::path dir = temp_dir();
  std::vector<double> losses[2];
  for (int graph = 0; graph < 2; ++graph) {
    const fs::path metrics = dir / ("m" + std::to_string(graph) + ".jsonl");
    Result r = kiln_cli("run " + pipeline("synthetic_resnet.toml") + " --metrics " +
                        metrics.string() + " --set run.cuda_graph=" + (graph ? "true" : "false"));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(r.output.find("run.cuda_graph: CUDA graphs need a CUDA device; the step runs "
                            "eagerly") != std::string::npos,
              graph == 1)
        << r.output;
    losses[graph] = step_losses(metrics);
  }
  ASSERT_EQ(losses[0].size(), 6u);
  EXPECT_EQ(losses[1], losses[0]);
  fs::remove_all(dir);
}

// On a GPU: the captured step (3 eager steps, then replays) trains to the losses of the eager
// run, in fp32 (TF32 and cuDNN's algorithm search off, so both runs take the same kernels) and
// under amp with dynamic loss scaling (the scale is a device tensor the graph reads). With
// loader workers, whose pinned batch buffers are allocated while the step is captured, the
// capture must hold too (thread-local capture mode: engine/graph_step.cpp).
TEST(Cli, CudaGraphReplaysTrainAsTheEagerStep) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  fs::path dir = temp_dir();
  const std::string cuda =
      " --set run.device='\"cuda\"' --set run.tf32='\"off\"'"
      " --set run.cudnn_benchmark=false --set run.max_steps=10"
      " --set data.synthetic_train=320";
  struct Case {
    std::string name, sets;
    double tolerance;
  };
  for (const Case& c : std::vector<Case>{
           {"fp32", " --set precision.name='\"fp32\"'", 1e-5},
           {"amp", " --set precision.name='\"amp\"'", 5e-3},
           {"fp32_workers", " --set precision.name='\"fp32\"' --set data.workers=2", 1e-5}}) {
    std::vector<double> losses[2];
    for (int graph = 0; graph < 2; ++graph) {
      const fs::path metrics = dir / (c.name + std::to_string(graph) + ".jsonl");
      Result r = kiln_cli("run " + pipeline("synthetic_resnet.toml") + cuda + " --metrics " +
                          metrics.string() + c.sets +
                          " --set run.cuda_graph=" + (graph ? "true" : "false"));
      ASSERT_EQ(r.code, 0) << r.output;
      EXPECT_EQ(r.output.find("run.cuda_graph: step captured for batches of 16 samples") !=
                    std::string::npos,
                graph == 1)
          << r.output;
      EXPECT_EQ(r.output.find("could not be captured"), std::string::npos) << r.output;
      losses[graph] = step_losses(metrics);
    }
    ASSERT_EQ(losses[0].size(), 10u) << c.name;
    ASSERT_EQ(losses[1].size(), 10u) << c.name;
    for (size_t i = 0; i < losses[0].size(); ++i) {
      EXPECT_NEAR(losses[1][i], losses[0][i], c.tolerance * losses[0][i])
          << c.name << " step " << i + 1;
    }
  }
  fs::remove_all(dir);
}

TEST(Cli, TrainsWithThePlainCOptimizerPlugin) {
  const std::string good = std::string(KILN_TEST_PLUGIN_DIR) + "/good";
  Result r = kiln_cli("run " + pipeline("c_plugin.toml"), "KILN_PLUGIN_PATH=" + good);
  ASSERT_EQ(r.code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(final test accuracy: ([0-9.]+)%)")))
      << r.output;
  EXPECT_GT(std::stod(m[1]), 50.0) << r.output;
  // Without the folder, the pipeline's optimizer is unknown and the user is told what exists.
  Result missing = kiln_cli("validate " + pipeline("c_plugin.toml"));
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.output.find("optimizer.name: unknown optimizer 'c_sgd'"), std::string::npos)
      << missing.output;
  // The pipeline may name the folder itself.
  Result by_key = kiln_cli("validate " + pipeline("c_plugin.toml") + " --set 'plugins.paths=[\"" +
                           good + "\"]'");
  EXPECT_EQ(by_key.code, 0) << by_key.output;
}

TEST(Cli, ConfigErrorsNameFileLineColumnAndKey) {
  fs::path dir = temp_dir();
  std::string file = write(dir / "typo.toml",
                           "[model]\nname = \"mlp\"\n\n[optimizer]\nname = \"sgd\"\nmomentun = "
                           "0.5\nlr = \"fast\"\n");
  Result r = kiln_cli("validate " + file);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.output, file + ":6:1: optimizer.momentun: unknown key; did you mean 'momentum'?\n" +
                          file + ":7:6: optimizer.lr: expected float, found string\n");
  Result over = kiln_cli("validate " + pipeline("synthetic_mlp.toml") + " --set optimizer.lr=-1");
  EXPECT_EQ(over.code, 2);
  EXPECT_EQ(over.output,
            "--set optimizer.lr=-1: optimizer.lr: value -1 is out of range; expected > 0\n");
  fs::remove_all(dir);
}

TEST(Cli, AMissingPipelineFileIsAUsageError) {
  Result r = kiln_cli("run /nonexistent/pipeline.toml");
  EXPECT_EQ(r.code, 2) << r.output;  // the README's code for configuration errors
  EXPECT_NE(r.output.find("File does not exist: /nonexistent/pipeline.toml"), std::string::npos)
      << r.output;
}

TEST(Cli, RefusesABrokenPluginBeforeTraining) {
  fs::path dir = temp_dir();
  fs::copy_file(std::string(KILN_TEST_PLUGIN_DIR) + "/libbad_init.so", dir / "libbad_init.so");
  Result r = kiln_cli("run " + pipeline("synthetic_mlp.toml"), "KILN_PLUGIN_PATH=" + dir.string());
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.output.find("error: plugin refused: " + (dir / "libbad_init.so").string() +
                          ": init failed: init refused: no licence file"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("training"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// A plugin whose entries let exceptions out (tests/plugins/throwing*.cpp) never kills the
// host: a throwing init refuses its library and `plugins list` goes on; a throw from an
// optimizer's step or a norm layer's backward ends the run with exit code 1, the entry and the
// library named.
TEST(Cli, AnExceptionOfAnyTypeFromAPluginNeverKillsTheHost) {
  const std::string plugins = KILN_TEST_PLUGIN_DIR;
  Result list = kiln_cli("plugins --plugin-path " + plugins + "/throwing_init list");
  EXPECT_EQ(list.code, 3) << list.output;
  EXPECT_NE(list.output.find("sgd "), std::string::npos) << list.output;
  EXPECT_NE(list.output.find("error: plugin refused: " + plugins +
                             "/throwing_init/libthrowing_init.so: init threw int"),
            std::string::npos)
      << list.output;

  const std::string with = "KILN_PLUGIN_PATH=" + plugins + "/throwing:" + plugins + "/good";
  const std::string base = "run " + pipeline("c_plugin.toml") + " --set run.epochs=1";
  Result step = kiln_cli(base +
                             " --set optimizer.name='\"throwing_opt\"' "
                             "--set optimizer.throw_at='\"step\"'",
                         with);
  EXPECT_EQ(step.code, 1) << step.output;
  EXPECT_NE(step.output.find("optimizer 'throwing_opt' step (" + plugins +
                             "/throwing/libthrowing.so) threw int"),
            std::string::npos)
      << step.output;

  Result backward =
      kiln_cli(base +
                   " --set norm.name='\"throwing_norm\"' "
                   "--set norm.throw_at='\"backward\"' --set norm.throw_what='\"std\"'",
               with);
  EXPECT_EQ(backward.code, 1) << backward.output;
  EXPECT_NE(backward.output.find("norm 'throwing_norm' backward"), std::string::npos)
      << backward.output;
  EXPECT_NE(backward.output.find("std::runtime_error: thrown from backward"), std::string::npos)
      << backward.output;

  // A throwing create is a broken plugin, not a refusal of options: a failure before the run.
  Result create = kiln_cli(base +
                               " --set lr_policy.name='\"throwing_lr\"' "
                               "--set lr_policy.throw_at='\"create\"'",
                           with);
  EXPECT_EQ(create.code, 1) << create.output;
  EXPECT_NE(create.output.find("lr_policy 'throwing_lr' create"), std::string::npos)
      << create.output;
  EXPECT_EQ(create.output.find("training"), std::string::npos) << create.output;
}

// What a component refuses at create, and what the engine cannot run (the world size, half
// batch-norm statistics), is a configuration error found before anything runs: exit code 2,
// the key's file:line:column (or the --set that gave it) and the component's own reason, from
// `validate` (which creates every component as a run does) and from `run` alike.
TEST(Cli, RefusalsAreConfigurationErrorsAtTheirKeyBeforeTheRun) {
  const std::string mlp = pipeline("synthetic_mlp.toml");
  const std::string resnet = pipeline("synthetic_resnet.toml");  // no [lr_policy]
  struct Case {
    std::string command, expect;
  };
  const std::vector<Case> cases = {
      {"validate " + mlp + " --set optimizer.nesterov=true --set optimizer.momentum=0",
       "--set optimizer.nesterov=true: optimizer.nesterov: optimizer 'sgd' refused its options: "
       "sgd: nesterov requires momentum > 0"},
      {"validate " + mlp + " --set lr_policy.steps=[30,20]",
       "--set lr_policy.steps=[30,20]: lr_policy.steps: lr_policy 'step' refused its options"},
      {"validate " + resnet + " --set lr_policy.name=exp --set lr_policy.gamma=0",
       "--set lr_policy.gamma=0: lr_policy.gamma: lr_policy 'exp' refused its options"},
      {"validate " + resnet + " --set lr_policy.name=cosine --set lr_policy.min_lr=1.0",
       "--set lr_policy.min_lr=1.0: lr_policy.min_lr: lr_policy 'cosine' refused its options"},
      {"run " + mlp + " --set model.dropout=1.0",
       "--set model.dropout=1.0: model.dropout: model 'mlp' could not be built: mlp: dropout"},
      {"validate " + mlp + " --world-size 3",
       mlp + ":12:14: data.batch_size: 64 is the global batch and must be a multiple of the world "
             "size 3"},
      {"validate " + pipeline("synthetic_resnet.toml") +
           " --world-size 4 --set model.norm=syncbn --set norm.group_size=3",
       "--set norm.group_size=3: norm.group_size: model 'resnet' could not be built: norm "
       "'syncbn' refused a layer of 8 features: syncbn: group_size 3 does not divide the world "
       "size 4"},
      {"run " + pipeline("synthetic_resnet.toml") + " --set precision.name=o3",
       "--set precision.name=o3: precision.name: precision 'o3' would keep the running "
       "statistics"},
  };
  for (const Case& c : cases) {
    Result r = kiln_cli(c.command);
    EXPECT_EQ(r.code, 2) << c.command << "\n" << r.output;
    EXPECT_EQ(r.output.rfind(c.expect, 0), 0u) << c.command << "\n" << r.output;
    EXPECT_EQ(r.output.find("training"), std::string::npos) << r.output;
  }
  // From the file, the position is the value's line and column.
  fs::path dir = temp_dir();
  std::ifstream in(mlp);
  std::stringstream text;
  text << in.rdbuf();
  const std::string file =
      write(dir / "nesterov.toml", std::regex_replace(text.str(), std::regex("momentum = 0.9"),
                                                      "momentum = 0.0\nnesterov = true"));
  Result r = kiln_cli("validate " + file);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output.rfind(file + ":23:12: optimizer.nesterov: optimizer 'sgd' refused", 0), 0u)
      << r.output;
  fs::remove_all(dir);
}

TEST(Cli, RefusesAComponentThatCannotRunOnTheDevice) {
  // Without a GPU, asking for cuda is refused with the reason before any data is read.
  Result r = kiln_cli("validate " + pipeline("synthetic_mlp.toml") + " --set run.device=cuda");
  if (r.code == 0) GTEST_SKIP() << "this machine has a CUDA device";
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.output,
            "--set run.device=cuda: run.device: \"cuda\" but no CUDA device is available\n");
}

}  // namespace

namespace {

// Accuracy of the last evaluation line in `output` ("test accuracy 97.50%"), or -1.
double last_accuracy(const std::string& output) {
  const std::regex re(R"(final test accuracy: ([0-9.]+)%)");
  std::smatch m;
  return std::regex_search(output, m, re) ? std::stod(m[1]) : -1.0;
}

}  // namespace

TEST(CliPrecision, EveryModeTrainsTheSyntheticPipeline) {
  for (const std::string mode : {"amp", "bf16", "o2", "O3 --set precision.keep_norm_fp32=true",
                                 "16-mixed", "bf16-true", "O0"}) {
    Result r = kiln_cli("run " + pipeline("synthetic_mlp.toml") + " --set precision.name=" + mode);
    ASSERT_EQ(r.code, 0) << mode << "\n" << r.output;
    EXPECT_GT(last_accuracy(r.output), 90.0) << mode << "\n" << r.output;
  }
}

// fp32 without clipping checks only the loss on unlogged steps (run.grad_check = "auto"): a
// diverging run is still caught there, named, skipped and stopped.
TEST(CliPrecision, DivergedFp32RunIsCaughtByItsLossBetweenLoggedSteps) {
  fs::path dir = temp_dir();
  Result r = kiln_cli("run " + pipeline("synthetic_mlp.toml") +
                      " --set optimizer.lr=1e4 --set run.output_dir=" + dir.string());
  ASSERT_EQ(r.code, 4) << r.output;
  EXPECT_NE(r.output.find("non-finite loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("consecutive steps with non-finite gradients or loss under precision "
                          "'fp32' (no loss scaling); the run diverged"),
            std::string::npos)
      << r.output;
  fs::remove_all(dir);
}

TEST(CliPrecision, DivergedRunWithoutScalingStopsWithItsWeightsAndExitCode4) {
  fs::path dir = temp_dir();
  Result r = kiln_cli(
      "run " + pipeline("synthetic_mlp.toml") +
      " --set precision.name=o3 --set optimizer.lr=1e4 --set run.output_dir=" + dir.string());
  ASSERT_EQ(r.code, 4) << r.output;
  EXPECT_NE(r.output.find("consecutive steps with non-finite gradients or loss under precision "
                          "'o3' (no "
                          "loss scaling); the run diverged"),
            std::string::npos)
      << r.output;
  const std::regex saved(R"(weights of the last step: (\S+weights-step-(\d+)\.safetensors))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, saved)) << r.output;
  // A safetensors file: 8-byte little-endian header length, then the JSON header.
  std::ifstream in(m[1].str(), std::ios::binary);
  ASSERT_TRUE(in.good()) << m[1];
  unsigned char le[8];
  in.read(reinterpret_cast<char*>(le), 8);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | le[i];
  std::string header(length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(length));
  EXPECT_NE(header.find(R"("layers.0.linear.weight":{"dtype":"BF16","shape":[64,784])"),
            std::string::npos)
      << header;
  EXPECT_NE(header.find(R"("__metadata__":{"step":")" + m[2].str()), std::string::npos) << header;
  fs::remove_all(dir);
}

TEST(CliPrecision, HalfBatchNormStatisticsAreRefusedBeforeTraining) {
  Result r = kiln_cli("run " + pipeline("synthetic_mlp.toml") +
                      " --set model.norm_layers=true --set precision.name=16-true");
  EXPECT_EQ(r.code, 2) << r.output;  // a configuration error, at the key that chose it
  EXPECT_EQ(r.output.rfind("--set precision.name=16-true: precision.name: ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("keep_norm_fp32 = true"), std::string::npos) << r.output;
}

TEST(CliPrecision, PlanShowsStaticMemoryPerPrecisionMode) {
  Result r = kiln_cli("plan " + pipeline("synthetic_mlp.toml") + " --set precision.name=o2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("static memory in MiB with optimizer sgd"), std::string::npos)
      << r.output;
  // 784·64 + 64 + 64·10 + 10 = 50890 parameters: fp32 weights 0.194 MiB, bf16 half that,
  // fp32 masters as much as fp32 weights, one momentum buffer like the stepped tensor.
  EXPECT_TRUE(std::regex_search(r.output,
                                std::regex(R"(# \* o2 +0\.097 +0\.097 +0\.194 +0\.194 +0\.582\n)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(#   float32 +0\.194 +0\.194 +0\.000 +0\.194 +0\.582\n)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(#   half +0\.097 +0\.097 +0\.000 +0\.097 +0\.291\n)")))
      << r.output;

  // [ema]'s average is an fp32 copy of every parameter in every mode: one more column.
  r = kiln_cli("plan " + pipeline("synthetic_mlp.toml") +
               " --set precision.name=o2 --set ema.decay=0.999");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(masters +optimizer +ema +total\n)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(# \* o2 +0\.097 +0\.097 +0\.194 +0\.194 +0\.194 +0\.777\n)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(#   half +0\.097 +0\.097 +0\.000 +0\.097 +0\.194 +0\.485\n)")))
      << r.output;
}

TEST(CliPrecision, AccumulationWindowsAreRemainderAware) {
  fs::path dir = temp_dir();
  fs::path metrics = dir / "metrics.jsonl";
  Result r = kiln_cli("run " + pipeline("synthetic_mlp.toml") +
                      " --set run.accumulation_steps=3 --metrics " + metrics.string());
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(metrics.string());
  std::string line, micro;
  const std::regex re(R"("micro_batches":(\d+))");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, re)) micro += m[1].str();
  }
  // 16 batches per epoch: five windows of 3 and a last one of 1, twice.
  EXPECT_EQ(micro, "333331333331");
  EXPECT_GT(last_accuracy(r.output), 90.0) << r.output;
  fs::remove_all(dir);
}

TEST(CliPlot, DrawsTheCurvesOfARunsMetrics) {
  fs::path dir = temp_dir();
  const std::string metrics = (dir / "m.jsonl").string(), png = (dir / "curves.png").string();
  ASSERT_EQ(kiln_cli("run " + pipeline("synthetic_mlp.toml") +
                     " --set run.output_dir=" + (dir / "out").string() + " --metrics " + metrics)
                .code,
            0);
  Result r = kiln_cli("plot " + metrics + " -o " + png);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(png, std::ios::binary);
  std::string signature(8, '\0');
  in.read(signature.data(), 8);
  EXPECT_EQ(signature, "\x89PNG\r\n\x1a\n");
  Result bad = kiln_cli("plot " + write(dir / "bad.jsonl", "{\"type\":\"step\",\n") + " -o " + png);
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("bad.jsonl:"), std::string::npos) << bad.output;
  fs::remove_all(dir);
}

// cairo lives in libkiln_plot, loaded from bin/../lib only when `kiln` plots: a `kiln` without
// it beside still trains, and `kiln plot` says what did not load.
TEST(CliPlot, WithoutThePlotModuleOnlyPlottingFailsAndSaysWhy) {
  fs::path dir = temp_dir();
  fs::create_directories(dir / "bin");
  fs::copy_file(KILN_CLI, dir / "bin" / "kiln");
  const std::string kiln = (dir / "bin" / "kiln").string(), metrics = (dir / "m.jsonl").string();
  const std::string plugins =
      "KILN_PLUGIN_PATH=" + fs::path(KILN_CLI).parent_path().string() + "/../plugins ";
  Result run = kiln::test::shell(plugins + kiln + " run " + pipeline("synthetic_mlp.toml") +
                                 " --set run.output_dir=" + (dir / "out").string() + " --metrics " +
                                 metrics);
  ASSERT_EQ(run.code, 0) << run.output;
  Result plot = kiln::test::shell(kiln + " plot " + metrics + " -o " + (dir / "c.png").string());
  EXPECT_EQ(plot.code, 1) << plot.output;
  EXPECT_NE(plot.output.find("plotting needs libkiln_plot.so (cairo), which did not load"),
            std::string::npos)
      << plot.output;
  EXPECT_FALSE(fs::exists(dir / "c.png"));
  fs::remove_all(dir);
}
