#include "dist/launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace kiln::dist {
namespace {

using Clock = std::chrono::steady_clock;

// Lines longer than this are passed on in pieces rather than buffered without bound.
constexpr size_t kMaxLine = 64 * 1024;

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// ---- signals: the handler only writes the signal number to a pipe the main loop polls.

int g_signal_pipe_write = -1;

void on_signal(int signal) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe_write, &byte, 1);
  errno = saved;
}

constexpr int kHandled[] = {SIGINT, SIGTERM, SIGCHLD};

// Installs the handlers for its lifetime and restores the caller's afterwards. One launch at a
// time per process: the pipe is a global the handler reaches.
class SignalPipe {
 public:
  SignalPipe() {
    if (pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error(errno_text("pipe2"));
    g_signal_pipe_write = fds_[1];
    struct sigaction action {};
    action.sa_handler = on_signal;
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < std::size(kHandled); ++i) sigaction(kHandled[i], &action, &previous_[i]);
  }
  ~SignalPipe() {
    for (size_t i = 0; i < std::size(kHandled); ++i) sigaction(kHandled[i], &previous_[i], nullptr);
    g_signal_pipe_write = -1;
    close(fds_[0]);
    close(fds_[1]);
  }
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int read_fd() const { return fds_[0]; }

  // Signals received since the last call, in order (SIGCHLD included).
  std::vector<int> drain() const {
    std::vector<int> out;
    unsigned char buf[64];
    ssize_t n;
    while ((n = read(fds_[0], buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
    return out;
  }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction previous_[std::size(kHandled)]{};
};

// Blocks the handled signals while alive (around fork, so that a child never runs our handler).
class BlockSignals {
 public:
  BlockSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : kHandled) sigaddset(&set, s);
    pthread_sigmask(SIG_BLOCK, &set, &previous_);
  }
  ~BlockSignals() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  const sigset_t& previous() const { return previous_; }

 private:
  sigset_t previous_;
};

// ---- children

struct Stream {
  int fd = -1;
  int target = 1;  // our fd the prefixed lines go to
  std::string pending;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  Stream out, err;
};

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own stdout is gone: nothing better to do with the line
    done += static_cast<size_t>(n);
  }
}

void emit_line(int rank, int target, const std::string& text) {
  // One write per line keeps lines of different ranks from interleaving.
  write_all(target, "[rank " + std::to_string(rank) + "] " + text + "\n");
}

// Reads what is available (the fds are non-blocking); on end of file flushes a partial last line
// and closes the stream.
void pump(int rank, Stream& s) {
  char buf[16384];
  for (;;) {
    const ssize_t n = read(s.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;  // EAGAIN: nothing more for now
    if (n == 0) {
      if (!s.pending.empty()) emit_line(rank, s.target, s.pending);
      s.pending.clear();
      close(s.fd);
      s.fd = -1;
      return;
    }
    s.pending.append(buf, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = s.pending.find('\n', start)) != std::string::npos) {
      emit_line(rank, s.target, s.pending.substr(start, nl - start));
      start = nl + 1;
    }
    s.pending.erase(0, start);
    if (s.pending.size() > kMaxLine) {
      emit_line(rank, s.target, s.pending);
      s.pending.clear();
    }
  }
}

void close_stream(int rank, Stream& s) {
  if (s.fd < 0) return;
  pump(rank, s);  // what the rank wrote before exiting is still in the pipe
  if (s.fd < 0) return;
  // A grandchild may still hold the pipe open: flush what we have and stop listening.
  if (!s.pending.empty()) emit_line(rank, s.target, s.pending);
  s.pending.clear();
  close(s.fd);
  s.fd = -1;
}

// Cores this process may run on (taskset, cgroup cpusets), shared by the node's ranks.
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

std::vector<std::string> child_environment(const LaunchOptions& o, int port, int attempt) {
  // Ours to set; an outer launcher's values (kiln launch inside torchrun) must not leak through.
  const char* overridden[] = {"RANK=",
                              "WORLD_SIZE=",
                              "LOCAL_RANK=",
                              "LOCAL_WORLD_SIZE=",
                              "MASTER_ADDR=",
                              "MASTER_PORT=",
                              "TORCHELASTIC_RESTART_COUNT=",
                              "TORCHELASTIC_MAX_RESTARTS=",
                              "TORCHELASTIC_USE_AGENT_STORE="};
  std::vector<std::string> env;
  bool has_omp = false;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool skip = false;
    for (const char* prefix : overridden) skip = skip || entry.rfind(prefix, 0) == 0;
    if (entry.rfind("OMP_NUM_THREADS=", 0) == 0) has_omp = true;
    if (!skip) env.push_back(entry);
  }
  // Unless asked otherwise, ranks split the cores so they do not oversubscribe them. One rank
  // keeps torch's default, as `kiln run` does (a forced single thread cost it a third of its
  // speed on the CPU and starved the host-side data path on a GPU).
  if (!has_omp && o.nproc > 1) {
    env.push_back("OMP_NUM_THREADS=" + std::to_string(std::max(1, usable_cores() / o.nproc)));
  }
  env.push_back("WORLD_SIZE=" + std::to_string(o.nnodes * o.nproc));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.nproc));
  env.push_back("MASTER_ADDR=" + o.master_addr);
  env.push_back("MASTER_PORT=" + std::to_string(port));
  env.push_back("TORCHELASTIC_RESTART_COUNT=" + std::to_string(attempt));
  env.push_back("TORCHELASTIC_MAX_RESTARTS=" + std::to_string(o.max_restarts));
  // Rank 0 hosts the store, anew in each attempt.
  env.push_back("TORCHELASTIC_USE_AGENT_STORE=False");
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// In the child between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(const std::vector<char*>& argv, const std::vector<char*>& envp,
                             int out_fd, int err_fd, int error_fd, pid_t launcher,
                             const sigset_t& mask) {
  // Its own process group: a terminal's Ctrl-C reaches the launcher only, which forwards it
  // once (Kiln treats a second SIGINT as "exit now"), and a stop reaches the rank's children.
  setpgid(0, 0);
  // Die with the launcher rather than train on as an orphan.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(127);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int s : kHandled) sigaction(s, &dfl, nullptr);
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  const int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) dup2(null_fd, 0);
  dup2(out_fd, 1);
  dup2(err_fd, 2);
  execve(argv[0], argv.data(), envp.data());
  const int e = errno;
  [[maybe_unused]] const ssize_t n = write(error_fd, &e, sizeof e);
  _exit(127);
}

void signal_group(const Child& c, int signal) {
  if (c.running) kill(-c.pid, signal);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  const int s = WTERMSIG(status);
  std::string text = "was killed by signal " + std::to_string(s) + " (" + strsignal(s) + ")";
  if (WCOREDUMP(status)) text += ", core dumped";
  return text;
}

int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, const std::vector<std::string>& argv)
      : options_(options), argv_(argv) {}

  ~Supervisor() {
    // Only reached with children still running when starting one failed: take them down.
    for (Child& c : children_) {
      if (!c.running) continue;
      kill(-c.pid, SIGKILL);
      waitpid(c.pid, nullptr, 0);
    }
    for (Child& c : children_) {
      if (c.out.fd >= 0) close(c.out.fd);
      if (c.err.fd >= 0) close(c.err.fd);
    }
  }

  int run() {
    for (int attempt = 0;; ++attempt) {
      const int code = run_attempt(attempt);
      if (code == 0) return 0;
      // Stopped on purpose (a forwarded SIGINT/SIGTERM, or one that came as the ranks ended):
      // not a failure to recover from.
      if (forwarded_ || stop_requested()) return code;
      if (attempt == options_.max_restarts) {
        if (options_.max_restarts > 0) {
          spdlog::error("the group failed {} time(s): no restarts left", attempt + 1);
        }
        return code;
      }
      spdlog::warn("restarting the group: restart {} of {}", attempt + 1, options_.max_restarts);
      children_.clear();
      failed_ = false;
      first_failure_code_ = 0;
      kill_deadline_.reset();
    }
  }

 private:
  // Starts the group and supervises it to its end; 0 or the first failing rank's code.
  int run_attempt(int attempt) {
    // A fresh port for each attempt: nothing of the last one's store can answer on it.
    const int port = options_.master_port != 0 ? options_.master_port : free_port();
    spdlog::info("launching {} rank(s) on node {} of {} ({} in all), master {}:{}{}",
                 options_.nproc, options_.node_rank, options_.nnodes,
                 options_.nproc * options_.nnodes, options_.master_addr, port,
                 attempt > 0 ? " (restart " + std::to_string(attempt) + ")" : std::string());
    std::vector<std::string> base_env = child_environment(options_, port, attempt);
    children_.reserve(static_cast<size_t>(options_.nproc));
    for (int local = 0; local < options_.nproc; ++local) start(base_env, local);
    supervise();
    return first_failure_code_;
  }

  // Whether a SIGINT or SIGTERM is waiting that no rank was left to receive.
  bool stop_requested() {
    bool stop = false;
    for (int signal : signals_.drain()) {
      if (signal == SIGCHLD) continue;
      spdlog::info("received signal {} ({}): not restarting", signal, strsignal(signal));
      stop = true;
    }
    return stop;
  }

  void start(const std::vector<std::string>& base_env, int local) {
    const int rank = options_.node_rank * options_.nproc + local;
    std::vector<std::string> env = base_env;
    env.push_back("RANK=" + std::to_string(rank));
    env.push_back("LOCAL_RANK=" + std::to_string(local));
    std::vector<std::string> args = argv_;
    const std::vector<char*> argv_p = pointers(args), env_p = pointers(env);

    int out[2], err[2], error[2];
    if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error(errno_text("pipe2"));
    if (pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]), close(out[1]);
      throw std::runtime_error(errno_text("pipe2"));
    }
    if (pipe2(error, O_CLOEXEC) != 0) {
      close(out[0]), close(out[1]), close(err[0]), close(err[1]);
      throw std::runtime_error(errno_text("pipe2"));
    }
    const pid_t launcher = getpid();
    pid_t pid;
    {
      BlockSignals block;
      pid = fork();
      if (pid == 0) exec_child(argv_p, env_p, out[1], err[1], error[1], launcher, block.previous());
    }
    const int fork_errno = errno;
    close(out[1]), close(err[1]), close(error[1]);
    if (pid < 0) {
      close(out[0]), close(err[0]), close(error[0]);
      errno = fork_errno;
      throw std::runtime_error(errno_text("fork"));
    }
    setpgid(pid, pid);  // also here: whichever of parent and child runs first, the group exists

    Child c;
    c.rank = rank;
    c.pid = pid;
    c.running = true;
    c.out = {out[0], 1, {}};
    c.err = {err[0], 2, {}};
    fcntl(c.out.fd, F_SETFL, O_NONBLOCK);
    fcntl(c.err.fd, F_SETFL, O_NONBLOCK);
    children_.push_back(std::move(c));

    // The error pipe closes on a successful exec; an errno on it means execve failed.
    int exec_errno = 0;
    ssize_t n;
    do {
      n = read(error[0], &exec_errno, sizeof exec_errno);
    } while (n < 0 && errno == EINTR);
    close(error[0]);
    if (n == static_cast<ssize_t>(sizeof exec_errno)) {
      waitpid(pid, nullptr, 0);
      children_.back().running = false;
      throw std::runtime_error("cannot start rank " + std::to_string(rank) + " ('" + argv_[0] +
                               "'): " + std::strerror(exec_errno));
    }
    spdlog::info("rank {}: pid {}", rank, pid);
  }

  void supervise() {
    while (running_count() > 0) {
      std::vector<pollfd> fds{{signals_.read_fd(), POLLIN, 0}};
      std::vector<Stream*> streams;
      for (Child& c : children_) {
        for (Stream* s : {&c.out, &c.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
      // Reaping is driven by SIGCHLD; the cap is a safety net should it be blocked elsewhere.
      int timeout_ms = 250;
      if (kill_deadline_) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(*kill_deadline_ - Clock::now())
                .count();
        timeout_ms = static_cast<int>(std::max<long long>(0, std::min<long long>(left, 250)));
      }
      const int ready = poll(fds.data(), fds.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) throw std::runtime_error(errno_text("poll"));

      for (int signal : signals_.drain()) {
        if (signal == SIGCHLD) continue;
        spdlog::info("received signal {} ({}): forwarding it to the ranks", signal,
                     strsignal(signal));
        forwarded_ = true;
        for (const Child& c : children_) signal_group(c, signal);
      }
      for (size_t i = 0; ready > 0 && i < streams.size(); ++i) {
        if (fds[i + 1].revents == 0) continue;
        pump(rank_of(*streams[i]), *streams[i]);
      }
      reap();
      if (kill_deadline_ && Clock::now() >= *kill_deadline_) {
        for (const Child& c : children_) {
          if (!c.running) continue;
          spdlog::error("rank {} (pid {}) still running {:g} s after SIGTERM: sending SIGKILL",
                        c.rank, c.pid, options_.grace_seconds);
          signal_group(c, SIGKILL);
        }
        kill_deadline_.reset();
      }
    }
    for (Child& c : children_) {
      close_stream(c.rank, c.out);
      close_stream(c.rank, c.err);
    }
  }

  void reap() {
    for (Child& c : children_) {
      if (!c.running) continue;
      int status = 0;
      const pid_t r = waitpid(c.pid, &status, WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR)) continue;
      c.running = false;
      if (r < 0) {
        spdlog::error("rank {} (pid {}): waitpid failed: {}", c.rank, c.pid, std::strerror(errno));
        status = 0xff00;  // reported as exit code 255
      }
      // Pass on what it wrote before its exit line.
      close_stream(c.rank, c.out);
      close_stream(c.rank, c.err);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        spdlog::info("rank {} (pid {}) finished", c.rank, c.pid);
        continue;
      }
      if (failed_) {
        spdlog::info("rank {} (pid {}) {}", c.rank, c.pid, describe(status));
        continue;
      }
      failed_ = true;
      first_failure_code_ = exit_code(status);
      spdlog::error("rank {} (pid {}) {}", c.rank, c.pid, describe(status));
      // After a forwarded SIGINT/SIGTERM the ranks are stopping on their own (saving a
      // checkpoint); one more signal would make Kiln exit at once, so leave them be.
      if (running_count() > 0 && !forwarded_) {
        spdlog::error("stopping the other ranks (SIGTERM, then SIGKILL after {:g} s)",
                      options_.grace_seconds);
        for (const Child& other : children_) signal_group(other, SIGTERM);
        kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(options_.grace_seconds));
      }
    }
  }

  int running_count() const {
    int n = 0;
    for (const Child& c : children_) n += c.running ? 1 : 0;
    return n;
  }

  int rank_of(const Stream& s) const {
    for (const Child& c : children_) {
      if (&c.out == &s || &c.err == &s) return c.rank;
    }
    return -1;
  }

  const LaunchOptions& options_;
  const std::vector<std::string>& argv_;
  SignalPipe signals_;  // installed before the first fork, so no signal is missed
  std::vector<Child> children_;
  bool failed_ = false;
  bool forwarded_ = false;  // a SIGINT/SIGTERM of ours was passed on to the ranks
  int first_failure_code_ = 0;
  std::optional<Clock::time_point> kill_deadline_;
};

}  // namespace

int launch(const LaunchOptions& options, const std::vector<std::string>& argv) {
  if (argv.empty()) throw std::invalid_argument("launch: no program to run");
  if (options.nproc < 1) throw std::invalid_argument("launch: nproc must be at least 1");
  if (options.nnodes < 1) throw std::invalid_argument("launch: nnodes must be at least 1");
  if (options.node_rank < 0 || options.node_rank >= options.nnodes) {
    throw std::invalid_argument("launch: node_rank " + std::to_string(options.node_rank) +
                                " is not in [0, " + std::to_string(options.nnodes) + ")");
  }
  if (options.nnodes > 1 && options.master_port == 0) {
    throw std::invalid_argument("launch: a run across nodes needs an explicit master port");
  }
  if (options.max_restarts < 0) throw std::invalid_argument("launch: max_restarts is negative");
  if (options.nnodes > 1 && options.max_restarts > 0) {
    throw std::invalid_argument(
        "launch: restarts (max_restarts) are for a single node; across nodes use torchrun "
        "--rdzv-backend c10d --max-restarts");
  }
  if (options.master_port < 0 || options.master_port > 65535) {
    throw std::invalid_argument("launch: master port " + std::to_string(options.master_port) +
                                " is out of range");
  }
  Supervisor supervisor(options, argv);
  return supervisor.run();
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(errno_text("free_port: socket"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string message = errno_text("free_port: bind");
    close(fd);
    throw std::runtime_error(message);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace kiln::dist
