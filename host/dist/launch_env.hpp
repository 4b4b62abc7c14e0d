// Where this process sits in a distributed run, read from the environment a launcher leaves:
// `kiln launch` and torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) or Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
// or SLURM_TASKS_PER_NODE, the first host of SLURM_JOB_NODELIST), and the elastic variables
// torchrun and `kiln launch` add (TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID,
// TORCHELASTIC_USE_AGENT_STORE). Torch-free.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace kiln::dist {

struct LaunchEnv {
  int rank = 0;  // global rank, 0 … world_size-1
  int world_size = 1;
  int local_rank = 0;                     // rank on this node: picks the CUDA device
  int local_world_size = 1;               // ranks on this node
  std::string master_addr = "127.0.0.1";  // host of rank 0, where the TCP store listens
  int master_port = 29500;
  std::string source;  // "torchrun" (also kiln launch) or "slurm": for messages
  // The launcher's agent hosts the TCP store at master_addr:master_port and keeps it across
  // restarts of the ranks (torchrun: TORCHELASTIC_USE_AGENT_STORE=True); no rank hosts one.
  bool agent_store = false;
  int restart_count = 0;        // restarts of the group so far, as this node's launcher counts
  std::string run_id = "none";  // the launcher's job id (torchrun --rdzv-id)
};

// Looks a variable up; the default reads the process environment. Tests pass a map.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

// The launch environment, or nullopt when none is set (a plain single-process run).
// torchrun's variables win over Slurm's when both are present (torchrun inside an allocation).
// Slurm without MASTER_ADDR uses the first host of the node list; without MASTER_PORT, a port
// derived from SLURM_JOB_ID so that jobs sharing a node do not collide.
// Throws std::invalid_argument naming the variable when one is malformed or inconsistent
// (rank ≥ world size, a non-numeric value, a missing companion variable).
std::optional<LaunchEnv> read_launch_env(const EnvLookup& env = process_env());

// The first host of a Slurm host list: "node[01-04,07],gpu3" → "node01"; "a,b" → "a".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace kiln::dist
