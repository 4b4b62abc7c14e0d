// Elastic restarts: one rank of every attempt is killed (SIGKILL) in turn, the launcher starts
// the group again (--max-restarts) and `kiln run --resume auto` continues from the newest
// checkpoint; the run must end exactly as an uninterrupted one (weights bit for bit, the same
// evaluation). Under torchrun with a static master port, under torchrun's c10d rendezvous with
// two agents (two "nodes" on this host, whose restart counts disagree), and under
// `kiln launch --max-restarts`. The restarted ranks must not read the previous attempt's keys
// from a store that outlives it (torchrun's agent store): dist/attempt_store.hpp.
// Also: a one-machine `kiln launch` keeps its rendezvous store on loopback.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "ddp_fixture.hpp"
#include "dist/launcher.hpp"
#include "listeners.hpp"

namespace {

using namespace kiln::test::ddp;

constexpr int kSteps = 600;  // long enough that three kills land well before the end
constexpr int kEvery = 20;   // steps between checkpoints
constexpr int kRounds = 3;   // ranks killed, one per attempt: rank 1, rank 0, rank 1

// The newest checkpoint's step in `dir` (0 when none; unfinished ones not counted).
int newest_checkpoint(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  int newest = 0;
  while (const dirent* e = readdir(d)) {
    int step = 0;
    char tail = 0;
    if (std::sscanf(e->d_name, "step-%d%c", &step, &tail) == 1) newest = std::max(newest, step);
  }
  closedir(d);
  return newest;
}

// One variable of a process's environment ("" when absent or the process is gone).
std::string environ_of(pid_t pid, const std::string& name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
  for (std::string entry; std::getline(in, entry, '\0');) {
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
  }
  return "";
}

pid_t parent_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  char state = 0;
  pid_t ppid = -1;
  rest >> state >> ppid;
  return ppid;
}

// The processes whose parent is one of `launchers`.
std::vector<pid_t> children_of(const std::vector<pid_t>& launchers) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  while (const dirent* e = d != nullptr ? readdir(d) : nullptr) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid > 0 &&
        std::find(launchers.begin(), launchers.end(), parent_of(pid)) != launchers.end()) {
      out.push_back(pid);
    }
  }
  if (d != nullptr) closedir(d);
  return out;
}

// The child of `launchers` running global rank `rank`, not one of `old` (an earlier attempt's
// ranks, perhaps still being stopped), or -1.
pid_t rank_of_new_attempt(const std::vector<pid_t>& launchers, int rank,
                          const std::vector<pid_t>& old) {
  for (pid_t pid : children_of(launchers)) {
    if (std::find(old.begin(), old.end(), pid) != old.end()) continue;
    if (environ_of(pid, "RANK") == std::to_string(rank)) return pid;
  }
  return -1;
}

// `command` in the background, its output to `log`; the pid is the command's own (exec).
pid_t start_background(const std::string& command, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string line = "exec " + command + " > " + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class Elastic : public Ddp {
 protected:
  // `kiln run`'s arguments: the prepared pipeline trained for kSteps, checkpointed every
  // kEvery steps, resuming from the newest checkpoint when there is one.
  std::string run_args(const std::string& name) {
    pipeline(name, 32, 1, kSteps);
    return scratch_.path(name + ".toml") +
           " --set run.epochs=1000 --set run.checkpoint_every=" + std::to_string(kEvery) +
           " --resume auto --metrics " + scratch_.path(name + ".jsonl");
  }

  // The same run, never interrupted.
  void uninterrupted() {
    const Result r = shell(std::string(KILN_CLI) + " launch --nproc 2 " + run_args("whole"));
    ASSERT_EQ(r.code, 0) << r.output;
  }

  // Kills rank 1, 0, 1 of attempts 0, 1, 2 (each once it has written checkpoints of its own)
  // and waits for the launchers to finish; their exit codes. `logs` are the launchers' output.
  std::vector<int> kill_every_attempt(const std::string& name, const std::vector<pid_t>& launchers,
                                      const std::vector<std::string>& logs) {
    int last = 0;            // the newest checkpoint when the previous rank was killed
    std::vector<pid_t> old;  // the ranks alive then
    for (int attempt = 0; attempt < kRounds; ++attempt) {
      const int victim = attempt % 2 == 0 ? 1 : 0;
      pid_t pid = -1;
      // Three checkpoints past the last kill: at least two written by this attempt, which
      // resumed from one at most one past it.
      const bool due = wait_for(
          [&] {
            if (newest_checkpoint(checkpoint_dir(name)) < last + 3 * kEvery) return false;
            pid = rank_of_new_attempt(launchers, victim, old);
            return pid > 0;
          },
          120);
      if (!due) {
        ADD_FAILURE() << "attempt " << attempt << " did not reach step " << last + 3 * kEvery
                      << " (newest checkpoint " << newest_checkpoint(checkpoint_dir(name)) << "):\n"
                      << output(logs);
        break;
      }
      last = newest_checkpoint(checkpoint_dir(name));
      EXPECT_LT(last, kSteps - 4 * kEvery) << "killed too late to test a restart";
      old = children_of(launchers);
      kill(pid, SIGKILL);
    }
    std::vector<int> codes;
    for (pid_t launcher : launchers) codes.push_back(wait_exit(launcher, 180));
    return codes;
  }

  static std::string output(const std::vector<std::string>& logs) {
    std::string text;
    for (const auto& log : logs) text += slurp(log);
    return text;
  }

  // The interrupted run `name` ended as the uninterrupted one: every restart resumed, the same
  // weights bit for bit and the same final evaluation.
  void expect_same_end(const std::string& name, const std::string& log) {
    EXPECT_EQ(count(log, "resumed from"), static_cast<size_t>(kRounds)) << log;
    EXPECT_EQ(max_diff(weights(name, kSteps), weights("whole", kSteps)), 0.0) << log;
    const std::regex eval(R"("accuracy":([0-9.e-]+),"loss":([0-9.e-]+))");
    std::smatch a, b;
    const std::string ea = last_eval(name), eb = last_eval("whole");
    ASSERT_TRUE(std::regex_search(ea, a, eval)) << ea;
    ASSERT_TRUE(std::regex_search(eb, b, eval)) << eb;
    EXPECT_EQ(a[1], b[1]);
    EXPECT_EQ(a[2], b[2]);
  }

  std::string torchrun() const {
    return std::string(KILN_TEST_PYTHON) + " -m torch.distributed.run --no-python --max-restarts " +
           std::to_string(kRounds) + " --monitor-interval 0.1 ";
  }
};

TEST_F(Elastic, TorchrunRestartsResumeExactly) {
  uninterrupted();
  const std::string log = scratch_.path("torchrun.log");
  const pid_t agent = start_background(torchrun() + "--nproc-per-node 2 --master-port " +
                                           std::to_string(kiln::dist::free_port()) + " " +
                                           KILN_CLI + " run " + run_args("torchrun"),
                                       log);
  const std::vector<int> codes = kill_every_attempt("torchrun", {agent}, {log});
  EXPECT_EQ(codes[0], 0) << slurp(log);
  expect_same_end("torchrun", slurp(log));
}

TEST_F(Elastic, TorchrunC10dRendezvousOfTwoAgentsRestartsResumeExactly) {
  // Two agents of one rank each meet at a c10d rendezvous, as two nodes would. The agent whose
  // rank was killed counts a restart; the other may restart for the new round without counting
  // it, so the ranks of one attempt can hold different TORCHELASTIC_RESTART_COUNTs.
  uninterrupted();
  const std::string command =
      torchrun() + "--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-id elastic " +
      "--rdzv-endpoint 127.0.0.1:" + std::to_string(kiln::dist::free_port()) + " " + KILN_CLI +
      " run " + run_args("c10d");
  const std::vector<std::string> logs = {scratch_.path("c10d-a.log"), scratch_.path("c10d-b.log")};
  const pid_t a = start_background(command, logs[0]);
  const pid_t b = start_background(command, logs[1]);
  const std::vector<int> codes = kill_every_attempt("c10d", {a, b}, logs);
  EXPECT_EQ(codes[0], 0) << output(logs);
  EXPECT_EQ(codes[1], 0) << output(logs);
  expect_same_end("c10d", output(logs));
}

TEST_F(Elastic, KilnLaunchRestartsResumeExactly) {
  uninterrupted();
  const std::string log = scratch_.path("launch.log");
  const pid_t launcher =
      start_background(std::string(KILN_CLI) + " launch --grace 2 --nproc 2 " + "--max-restarts " +
                           std::to_string(kRounds) + " " + run_args("launch"),
                       log);
  const std::vector<int> codes = kill_every_attempt("launch", {launcher}, {log});
  const std::string text = slurp(log);
  EXPECT_EQ(codes[0], 0) << text;
  for (int r = 1; r <= kRounds; ++r) {
    EXPECT_NE(text.find("restarting the group: restart " + std::to_string(r) + " of " +
                        std::to_string(kRounds)),
              std::string::npos)
        << text;
  }
  expect_same_end("launch", text);
}

using kiln::test::listeners;

TEST_F(Elastic, OneMachineLaunchListensOnLoopbackOnly) {
  // A long run; while it trains, whatever listens on the master port kiln launch chose must be
  // 127.0.0.1 (0100007F in /proc's byte order), not every interface (00000000 or ::).
  pipeline("loopback", 32, 1, 1000000);
  const std::string log = scratch_.path("loopback.log");
  const pid_t launcher = start_background(
      std::string(KILN_CLI) + " launch --nproc 2 " + scratch_.path("loopback.toml") +
          " --set run.epochs=100000 --set run.eval=false --set run.checkpoints=false",
      log);
  std::smatch m;
  const std::regex master(R"(master 127\.0\.0\.1:(\d+))");
  ASSERT_TRUE(wait_for(
      [&] {
        const std::string text = slurp(log);
        return std::regex_search(text, m, master) && text.find("step 1: lr") != std::string::npos;
      },
      60))
      << slurp(log);
  const std::string port_text = m[1];
  const std::vector<std::string> addresses = listeners(std::stoi(port_text));
  kill(launcher, SIGKILL);  // takes the ranks with it (PR_SET_PDEATHSIG)
  wait_exit(launcher, 30);
  ASSERT_FALSE(addresses.empty()) << "nothing listens on port " << port_text;
  for (const std::string& a : addresses) EXPECT_EQ(a, "0100007F") << slurp(log);
}

}  // namespace
