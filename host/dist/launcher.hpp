// `kiln launch`: starts the local ranks of a distributed run as child processes (what
// torch.distributed.launch / torchrun's local agent do) and supervises them. Torch-free.
#pragma once

#include <string>
#include <vector>

namespace kiln::dist {

struct LaunchOptions {
  int nproc = 1;      // ranks started on this node
  int nnodes = 1;     // nodes in the run
  int node_rank = 0;  // this node's index; global rank = node_rank × nproc + local rank
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free port (single node only)
  // Seconds between the first rank failing and the others being killed with SIGKILL after a
  // SIGTERM (they normally fail on their own within the collective timeout).
  double grace_seconds = 10.0;
  // Times the whole group is started again after a rank fails (torchrun's --max-restarts).
  // Single node only: each node's launcher would restart on its own and could not agree.
  int max_restarts = 0;
};

// Starts options.nproc children running `argv` (argv[0] is the program path), each with RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, torchrun's
// TORCHELASTIC_RESTART_COUNT (0, 1, … per attempt), TORCHELASTIC_MAX_RESTARTS and
// TORCHELASTIC_USE_AGENT_STORE=False (rank 0 hosts the store), and, unless the caller's
// environment sets it, OMP_NUM_THREADS = max(1, usable cores ÷ nproc) when nproc > 1 (one rank
// keeps torch's default). CUDA_VISIBLE_DEVICES is passed on unchanged; each rank picks the
// device of its local rank among the visible ones.
// Logs "rank N: pid P" for each child as it starts (so an operator, or a test, can signal one).
// Every line a child writes to stdout or stderr is copied to the same stream prefixed with
// "[rank N] ". SIGINT and SIGTERM received by the launcher are forwarded to every child.
// Returns 0 when every rank exits 0. When a rank exits non-zero or is killed, logs
// "rank N (pid P) exited with code C" / "was killed by signal S (NAME)", stops the others
// (SIGTERM, then SIGKILL after grace_seconds). Then, as torchrun does, it starts the whole group
// again, up to options.max_restarts times (on a fresh port unless master_port is given), unless
// the failure followed a SIGINT or SIGTERM it forwarded. Returns 0 as soon as an attempt
// succeeds, else the last attempt's first failing rank's exit code (128 + signal for a signal).
// Throws std::runtime_error when a child cannot be started.
int launch(const LaunchOptions& options, const std::vector<std::string>& argv);

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
int free_port();

}  // namespace kiln::dist
