// kiln::dist::launch with /bin/sh scripts as ranks: the environment each rank sees, the
// "[rank N] " prefixing of their output, the first failure's code and the stopping of the others
// (SIGTERM, then SIGKILL), and SIGTERM forwarding. The launcher runs in a forked child of the test
// with its stdout and stderr going to files.
#include "dist/launcher.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace kiln::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

class Launcher : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "kiln_launcher_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    const int rc = std::system(("rm -rf '" + dir_ + "'").c_str());
    EXPECT_EQ(rc, 0) << "could not remove " << dir_;
  }

  struct Outcome {
    int code = -1;
    std::string out, err;
    double seconds = 0;
  };

  // Runs launch(options, sh -c script) in a forked process; `in_child` adjusts its environment
  // first, `while_running` gets its pid. Kills it and fails after 20 s.
  Outcome run(const LaunchOptions& options, const std::string& script,
              const std::function<void()>& in_child = {},
              const std::function<void(pid_t)>& while_running = {}) {
    const std::string out_path = dir_ + "/out", err_path = dir_ + "/err";
    const auto start = Clock::now();
    const pid_t pid = fork();
    if (pid == 0) {
      const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0) _exit(101);
      dup2(out, 1);
      dup2(err, 2);
      if (in_child) in_child();
      int code;
      try {
        code = launch(options, {"/bin/sh", "-c", script});
      } catch (const std::exception& e) {
        std::fprintf(stderr, "launch threw: %s\n", e.what());
        code = 100;
      }
      spdlog::default_logger()->flush();
      std::fflush(nullptr);
      _exit(code);
    }
    Outcome o;
    if (pid < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      return o;
    }
    if (while_running) while_running(pid);
    int status = 0;
    for (;;) {
      if (waitpid(pid, &status, WNOHANG) == pid) break;
      if (Clock::now() - start > std::chrono::seconds(20)) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ADD_FAILURE() << "the launcher did not finish within 20 s";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    o.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    o.out = read_text(out_path);
    o.err = read_text(err_path);
    return o;
  }

  std::string dir_;
};

const char* kEnvScript =
    "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
    "${OMP_NUM_THREADS-unset}\"; printf \"no newline from $RANK\" >&2";

// The launcher's default thread count for `nproc` ranks: the usable cores split between them.
std::string threads_per_rank(int nproc) {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  return std::to_string(std::max(1, CPU_COUNT(&set) / nproc));
}

TEST_F(Launcher, RanksSeeTheirEnvironmentAndOutputIsPrefixed) {
  LaunchOptions options;
  options.nproc = 3;
  const Outcome o = run(options, kEnvScript, [] {
    unsetenv("OMP_NUM_THREADS");
    setenv("RANK", "99", 1);  // the launcher's own values win
    setenv("MASTER_PORT", "1", 1);
  });
  EXPECT_EQ(o.code, 0) << o.out << o.err;

  std::smatch m;
  const std::string threads = threads_per_rank(3);
  ASSERT_TRUE(std::regex_search(
      o.out, m, std::regex(R"(\[rank 0\] 0 3 0 3 127\.0\.0\.1 (\d+) )" + threads + "\n")))
      << o.out;
  const int port = std::stoi(m[1]);
  EXPECT_GT(port, 1);
  for (int r = 0; r < 3; ++r) {
    const std::string rank = std::to_string(r);
    EXPECT_NE(o.out.find("[rank " + rank + "] " + rank + " 3 " + rank + " 3 127.0.0.1 " +
                         std::to_string(port) + " " + threads + "\n"),
              std::string::npos)
        << o.out;
    // The partial last line comes out at end of file, on stderr, with the prefix.
    EXPECT_NE(o.err.find("[rank " + rank + "] no newline from " + rank + "\n"), std::string::npos)
        << o.err;
    EXPECT_NE(o.out.find("rank " + rank + ": pid "), std::string::npos) << o.out;
  }
}

TEST_F(Launcher, SecondNodeRanksAndCallersThreadCount) {
  LaunchOptions options;
  options.nproc = 2;
  options.nnodes = 2;
  options.node_rank = 1;
  options.master_addr = "10.1.2.3";
  options.master_port = 23456;
  const Outcome o = run(options, kEnvScript, [] { setenv("OMP_NUM_THREADS", "7", 1); });
  EXPECT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("[rank 2] 2 4 0 2 10.1.2.3 23456 7\n"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("[rank 3] 3 4 1 2 10.1.2.3 23456 7\n"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("[rank 0]"), std::string::npos) << o.out;
}

TEST_F(Launcher, OneRankKeepsTorchsThreadDefault) {
  // A forced single thread made `kiln launch --nproc 1` a third slower than `kiln run`.
  LaunchOptions options;
  const Outcome o = run(options, kEnvScript, [] { unsetenv("OMP_NUM_THREADS"); });
  EXPECT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("[rank 0] 0 1 0 1 127.0.0.1 "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find(" unset\n"), std::string::npos) << o.out;
}

TEST_F(Launcher, ManyLinesFromManyRanksStayWhole) {
  LaunchOptions options;
  options.nproc = 3;
  const Outcome o = run(options,
                        "i=0; while [ $i -lt 400 ]; do echo \"line $RANK $i "
                        "abcdefghijklmnopqrstuvwxyz\"; i=$((i+1)); done");
  EXPECT_EQ(o.code, 0) << o.err;
  int lines[3] = {0, 0, 0};
  std::istringstream in(o.out);
  std::string line;
  const std::regex pattern(R"(\[rank (\d)\] line (\d) (\d+) abcdefghijklmnopqrstuvwxyz)");
  while (std::getline(in, line)) {
    if (line.rfind("[rank ", 0) != 0) continue;  // the launcher's own log lines
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, pattern)) << "torn line: '" << line << "'";
    EXPECT_EQ(m[1], m[2]) << line;
    EXPECT_EQ(std::stoi(m[3]), lines[std::stoi(m[1])]++) << line;  // in order within a rank
  }
  for (int r = 0; r < 3; ++r) EXPECT_EQ(lines[r], 400) << "rank " << r;
}

TEST_F(Launcher, FirstFailureStopsTheOthersAndIsReturned) {
  LaunchOptions options;
  options.nproc = 2;
  options.grace_seconds = 1.0;
  // Rank 0's shell runs `sleep` as its own child: stopping must reach the whole group.
  const Outcome o = run(options, "if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 3; fi; sleep 60");
  EXPECT_EQ(o.code, 3) << o.out << o.err;
  EXPECT_LT(o.seconds, 5.0);
  EXPECT_NE(o.out.find("rank 1 (pid"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("exited with code 3"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("rank 0 (pid"), std::string::npos) << o.out;  // stopped, and said so
  EXPECT_NE(o.out.find("was killed by signal 15"), std::string::npos) << o.out;
}

TEST_F(Launcher, RanksIgnoringSigtermGetSigkillAfterTheGrace) {
  LaunchOptions options;
  options.nproc = 2;
  options.grace_seconds = 0.5;
  const Outcome o =
      run(options, "if [ \"$RANK\" = 1 ]; then sleep 0.3; exit 3; fi; trap '' TERM; sleep 60");
  EXPECT_EQ(o.code, 3) << o.out << o.err;
  EXPECT_GE(o.seconds, 0.5);
  EXPECT_LT(o.seconds, 5.0);
  EXPECT_NE(o.out.find("SIGKILL"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("was killed by signal 9"), std::string::npos) << o.out;
}

TEST_F(Launcher, KilledRankGives128PlusSignal) {
  LaunchOptions options;
  options.nproc = 2;
  options.grace_seconds = 1.0;
  const Outcome o = run(options, "if [ \"$RANK\" = 1 ]; then kill -9 $$; fi; sleep 60");
  EXPECT_EQ(o.code, 128 + SIGKILL) << o.out << o.err;
  EXPECT_LT(o.seconds, 5.0);
  EXPECT_NE(o.out.find("rank 1 (pid"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("killed by signal 9 (" + std::string(strsignal(SIGKILL)) + ")"),
            std::string::npos)
      << o.out;
}

TEST_F(Launcher, SigtermIsForwardedToEveryRank) {
  LaunchOptions options;
  options.nproc = 3;
  const std::string script = "trap 'echo stopped > " + dir_ + "/term.$RANK; exit 0' TERM; touch " +
                             dir_ + "/ready.$RANK; while :; do sleep 0.1; done";
  const Outcome o = run(options, script, {}, [&](pid_t launcher) {
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    for (int r = 0; r < 3; ++r) {
      while (!exists(dir_ + "/ready." + std::to_string(r)) && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    kill(launcher, SIGTERM);
  });
  EXPECT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_LT(o.seconds, 8.0);
  for (int r = 0; r < 3; ++r) {
    const std::string marker = dir_ + "/term." + std::to_string(r);
    EXPECT_TRUE(exists(marker)) << marker << "\n" << o.out;
    EXPECT_EQ(read_text(marker), "stopped\n");
  }
  EXPECT_NE(o.out.find("forwarding"), std::string::npos) << o.out;
}

TEST_F(Launcher, RestartsTheGroupUntilAnAttemptSucceeds) {
  // Rank 1 fails in attempts 0 and 1; rank 0 would run on, so the launcher must stop it before
  // each restart. Attempt 2 succeeds: exit code 0, as torchrun's.
  LaunchOptions options;
  options.nproc = 2;
  options.grace_seconds = 1.0;
  options.max_restarts = 3;
  const Outcome o =
      run(options,
          "echo \"attempt $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS "
          "$TORCHELASTIC_USE_AGENT_STORE port $MASTER_PORT\"; "
          "if [ $TORCHELASTIC_RESTART_COUNT -lt 2 ]; then "
          "if [ $RANK = 1 ]; then sleep 0.2; exit 5; fi; sleep 60; fi",
          [] { setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1); });  // an outer launcher's
  EXPECT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_LT(o.seconds, 8.0);
  for (int attempt = 0; attempt < 3; ++attempt) {
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(
          std::regex_search(o.out, std::regex("\\[rank " + std::to_string(rank) + "\\] attempt " +
                                              std::to_string(attempt) + " of 3 False port \\d+\n")))
          << o.out;
    }
  }
  EXPECT_NE(o.out.find("restarting the group: restart 1 of 3"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("restarting the group: restart 2 of 3"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("restart 3 of 3"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("(restart 2)"), std::string::npos) << o.out;  // the launch line says so
}

TEST_F(Launcher, SpentRestartsReturnTheLastAttemptsFailure) {
  LaunchOptions options;
  options.nproc = 2;
  options.grace_seconds = 1.0;
  options.max_restarts = 1;
  const Outcome o =
      run(options, "if [ $RANK = 1 ]; then exit $((3 + TORCHELASTIC_RESTART_COUNT)); fi; sleep 60");
  EXPECT_EQ(o.code, 4) << o.out << o.err;
  EXPECT_NE(o.out.find("exited with code 3"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("exited with code 4"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("the group failed 2 time(s): no restarts left"), std::string::npos) << o.out;
}

TEST_F(Launcher, AStopIsNotRestarted) {
  // SIGTERM to the launcher reaches the ranks, which exit non-zero: the user stopped the run.
  LaunchOptions options;
  options.nproc = 2;
  options.max_restarts = 2;
  const std::string script =
      "trap 'exit 143' TERM; touch " + dir_ +
      "/ready.$RANK.$TORCHELASTIC_RESTART_COUNT; while :; do sleep 0.1; done";
  const Outcome o = run(options, script, {}, [&](pid_t launcher) {
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    for (int r = 0; r < 2; ++r) {
      while (!exists(dir_ + "/ready." + std::to_string(r) + ".0") && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    kill(launcher, SIGTERM);
  });
  EXPECT_EQ(o.code, 143) << o.out << o.err;
  EXPECT_EQ(o.out.find("restarting"), std::string::npos) << o.out;
  EXPECT_FALSE(exists(dir_ + "/ready.0.1"));
}

TEST(LauncherInProcess, RestoresSignalHandlersAndRejectsBadOptions) {
  struct sigaction before_term {
  }, before_chld{}, after_term{}, after_chld{};
  sigaction(SIGTERM, nullptr, &before_term);
  sigaction(SIGCHLD, nullptr, &before_chld);
  LaunchOptions options;
  options.nproc = 2;
  EXPECT_EQ(launch(options, {"/bin/sh", "-c", "exit 0"}), 0);
  EXPECT_EQ(launch(options, {"/bin/sh", "-c", "exit $((RANK * 4))"}), 4);
  sigaction(SIGTERM, nullptr, &after_term);
  sigaction(SIGCHLD, nullptr, &after_chld);
  EXPECT_EQ(after_term.sa_handler, before_term.sa_handler);
  EXPECT_EQ(after_chld.sa_handler, before_chld.sa_handler);

  EXPECT_THROW(launch(options, {"/nonexistent/kiln", "run"}), std::runtime_error);
  EXPECT_THROW(launch(options, {}), std::invalid_argument);
  LaunchOptions across = options;
  across.nnodes = 2;  // needs an explicit port
  EXPECT_THROW(launch(across, {"/bin/true"}), std::invalid_argument);
  across.master_port = 29999;
  across.node_rank = 2;
  EXPECT_THROW(launch(across, {"/bin/true"}), std::invalid_argument);
  across.node_rank = 1;
  across.max_restarts = 1;  // restarts are for one node
  EXPECT_THROW(launch(across, {"/bin/true"}), std::invalid_argument);
  LaunchOptions negative = options;
  negative.max_restarts = -1;
  EXPECT_THROW(launch(negative, {"/bin/true"}), std::invalid_argument);
}

TEST(LauncherInProcess, FreePortIsBindable) {
  const int port = free_port();
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
}

}  // namespace
}  // namespace kiln::dist
