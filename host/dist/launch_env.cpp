#include "dist/launch_env.hpp"

#include <charconv>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <vector>

namespace kiln::dist {
namespace {

constexpr int kDefaultPort = 29500;

std::invalid_argument bad(const std::string& name, const std::string& value,
                          const std::string& why) {
  return std::invalid_argument(name + "='" + value + "' " + why);
}

// A whole-string decimal integer; anything else (empty, "4x", " 4") is an error naming `name`.
long long parse_int(const std::string& name, const std::string& value) {
  long long out = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (value.empty() || ec != std::errc() || ptr != end) throw bad(name, value, "is not an integer");
  return out;
}

int parse_in_range(const std::string& name, const std::string& value, long long lo, long long hi) {
  const long long v = parse_int(name, value);
  if (v < lo || v > hi) {
    throw bad(name, value,
              "is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return static_cast<int>(v);
}

constexpr long long kMaxRanks = 1 << 24;

struct Var {
  std::string name;
  std::optional<std::string> value;
};

Var get(const EnvLookup& env, const char* name) { return {name, env(name)}; }

int required_int(const EnvLookup& env, const char* name, const char* because, long long lo,
                 long long hi) {
  const Var v = get(env, name);
  if (!v.value) throw std::invalid_argument(std::string(name) + " is not set but " + because);
  return parse_in_range(v.name, *v.value, lo, hi);
}

// Slurm's per-node task counts, "2(x3),1" → {2, 2, 2, 1}; a plain "4" is one node's count.
std::vector<int> expand_tasks_per_node(const std::string& name, const std::string& value) {
  const auto malformed = [&] {
    return bad(name, value, "is not a Slurm task list like '2(x3),1'");
  };
  const auto positive = [&](const std::string& text) {
    long long v = 0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, v);
    if (text.empty() || ec != std::errc() || ptr != end || v < 1 || v > kMaxRanks) {
      throw malformed();
    }
    return static_cast<int>(v);
  };
  std::vector<int> counts;
  size_t start = 0;
  for (;;) {
    const size_t comma = value.find(',', start);
    const std::string entry =
        value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t paren = entry.find('(');
    int count = 0, repeat = 1;
    if (paren == std::string::npos) {
      count = positive(entry);
    } else {
      if (entry.size() < paren + 4 || entry.compare(paren, 2, "(x") != 0 || entry.back() != ')') {
        throw malformed();
      }
      count = positive(entry.substr(0, paren));
      repeat = positive(entry.substr(paren + 2, entry.size() - paren - 3));
    }
    if (counts.size() + static_cast<size_t>(repeat) > static_cast<size_t>(kMaxRanks)) {
      throw malformed();
    }
    counts.insert(counts.end(), static_cast<size_t>(repeat), count);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return counts;
}

void check_layout(const LaunchEnv& e, const std::string& rank_var, const std::string& world_var,
                  const std::string& local_rank_var, const std::string& local_world_var) {
  if (e.rank >= e.world_size) {
    throw std::invalid_argument(rank_var + "=" + std::to_string(e.rank) + " is not below " +
                                world_var + "=" + std::to_string(e.world_size));
  }
  if (e.local_world_size > e.world_size) {
    throw std::invalid_argument(local_world_var + "=" + std::to_string(e.local_world_size) +
                                " exceeds " + world_var + "=" + std::to_string(e.world_size));
  }
  if (e.local_rank >= e.local_world_size) {
    throw std::invalid_argument(local_rank_var + "=" + std::to_string(e.local_rank) +
                                " is not below " + local_world_var + "=" +
                                std::to_string(e.local_world_size));
  }
}

int port_of(const Var& v) { return parse_in_range(v.name, *v.value, 1, 65535); }

// torchrun and `kiln launch` set all six; with only RANK and WORLD_SIZE (a hand-made launch),
// every rank is taken to be on this node: local rank = rank, local world size = world size.
LaunchEnv read_torchrun(const EnvLookup& env) {
  LaunchEnv e;
  e.source = "torchrun";
  e.rank = required_int(env, "RANK", "WORLD_SIZE is", 0, kMaxRanks);
  e.world_size = required_int(env, "WORLD_SIZE", "RANK is", 1, kMaxRanks);
  const Var local_rank = get(env, "LOCAL_RANK"), local_world = get(env, "LOCAL_WORLD_SIZE");
  e.local_rank =
      local_rank.value ? parse_in_range(local_rank.name, *local_rank.value, 0, kMaxRanks) : e.rank;
  e.local_world_size = local_world.value
                           ? parse_in_range(local_world.name, *local_world.value, 1, kMaxRanks)
                           : e.world_size;
  check_layout(e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  const Var addr = get(env, "MASTER_ADDR"), port = get(env, "MASTER_PORT");
  if (addr.value) {
    if (addr.value->empty()) throw bad(addr.name, *addr.value, "is empty");
    e.master_addr = *addr.value;
  }
  e.master_port = port.value ? port_of(port) : kDefaultPort;
  if (const Var agent = get(env, "TORCHELASTIC_USE_AGENT_STORE"); agent.value) {
    // torchrun writes Python's str(bool); the C++ TCPStore compares the same way.
    if (*agent.value != "True" && *agent.value != "False") {
      throw bad(agent.name, *agent.value, "is neither 'True' nor 'False'");
    }
    e.agent_store = *agent.value == "True";
  }
  if (const Var restarts = get(env, "TORCHELASTIC_RESTART_COUNT"); restarts.value) {
    e.restart_count =
        parse_in_range(restarts.name, *restarts.value, 0, std::numeric_limits<int>::max());
  }
  if (const Var id = get(env, "TORCHELASTIC_RUN_ID"); id.value && !id.value->empty()) {
    e.run_id = *id.value;
  }
  return e;
}

// srun sets SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID and the task counts per node.
// The local world size is this node's entry (SLURM_NODEID) of the task list, or the first entry
// when SLURM_NODEID is absent. MASTER_ADDR / MASTER_PORT, when set, win over what is derived here.
LaunchEnv read_slurm(const EnvLookup& env) {
  LaunchEnv e;
  e.source = "slurm";
  e.rank = required_int(env, "SLURM_PROCID", "SLURM_NTASKS is", 0, kMaxRanks);
  e.world_size = required_int(env, "SLURM_NTASKS", "SLURM_PROCID is", 1, kMaxRanks);
  const Var local_id = get(env, "SLURM_LOCALID");
  e.local_rank =
      local_id.value ? parse_in_range(local_id.name, *local_id.value, 0, kMaxRanks) : e.rank;

  Var per_node = get(env, "SLURM_NTASKS_PER_NODE");
  if (!per_node.value) per_node = get(env, "SLURM_TASKS_PER_NODE");
  std::string local_world_var = per_node.name;
  if (per_node.value) {
    const std::vector<int> counts = expand_tasks_per_node(per_node.name, *per_node.value);
    const Var node_id = get(env, "SLURM_NODEID");
    size_t node = 0;
    if (node_id.value) {
      node = static_cast<size_t>(parse_in_range(node_id.name, *node_id.value, 0, kMaxRanks));
      // SLURM_NTASKS_PER_NODE is one count for every node; only a list is indexed by node.
      if (counts.size() == 1) node = 0;
      if (node >= counts.size()) {
        throw std::invalid_argument("SLURM_NODEID=" + *node_id.value + " has no entry in " +
                                    per_node.name + "='" + *per_node.value + "'");
      }
    }
    e.local_world_size = counts[node];
  } else {
    e.local_world_size = e.world_size;
    local_world_var = "SLURM_NTASKS";
  }
  check_layout(e, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_world_var);

  if (const Var addr = get(env, "MASTER_ADDR"); addr.value && !addr.value->empty()) {
    e.master_addr = *addr.value;
  } else {
    Var nodes = get(env, "SLURM_JOB_NODELIST");
    if (!nodes.value) nodes = get(env, "SLURM_NODELIST");
    if (nodes.value) {
      try {
        e.master_addr = first_slurm_host(*nodes.value);
      } catch (const std::invalid_argument& err) {
        throw bad(nodes.name, *nodes.value, std::string("is malformed: ") + err.what());
      }
    } else if (e.local_world_size < e.world_size) {
      throw std::invalid_argument(
          "neither MASTER_ADDR nor SLURM_JOB_NODELIST is set for a Slurm run across nodes");
    }
  }

  if (const Var port = get(env, "MASTER_PORT"); port.value) {
    e.master_port = port_of(port);
  } else if (const Var job = get(env, "SLURM_JOB_ID"); job.value) {
    // Jobs that share a node get different ports; every rank of one job derives the same one.
    const long long id = parse_int(job.name, *job.value);
    if (id < 0) throw bad(job.name, *job.value, "is negative");
    e.master_port = static_cast<int>(10000 + id % 20000);
  } else {
    e.master_port = kDefaultPort;
  }
  return e;
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::optional<LaunchEnv> read_launch_env(const EnvLookup& env) {
  if (env("RANK") || env("WORLD_SIZE")) return read_torchrun(env);
  if (env("SLURM_PROCID")) return read_slurm(env);
  return std::nullopt;
}

std::string first_slurm_host(const std::string& nodelist) {
  // The first top-level entry; within it, every bracket group "[01-04,07]" contributes its first
  // value, zero padding kept ("rack[1-2]-n[08-09]" → "rack1-n08").
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    const char c = nodelist[i];
    if (c == ']') throw std::invalid_argument("unbalanced ']' in host list '" + nodelist + "'");
    if (c != '[') {
      host += c;
      ++i;
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string::npos) {
      throw std::invalid_argument("unbalanced '[' in host list '" + nodelist + "'");
    }
    const std::string group = nodelist.substr(i + 1, close - i - 1);
    const size_t end = group.find_first_of("-,");
    const std::string first = group.substr(0, end);
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos) {
      throw std::invalid_argument("bad range '[" + group + "]' in host list '" + nodelist + "'");
    }
    host += first;
    i = close + 1;
  }
  if (host.empty()) throw std::invalid_argument("empty first host in host list '" + nodelist + "'");
  return host;
}

}  // namespace kiln::dist
