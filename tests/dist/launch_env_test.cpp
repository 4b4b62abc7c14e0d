// kiln::dist::read_launch_env: torchrun's and Slurm's variables become a LaunchEnv; no variables
// mean a plain run; malformed or inconsistent values throw naming the variable and the value.
// first_slurm_host expands Slurm's host-list syntax.
#include "dist/launch_env.hpp"

#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>

namespace kiln::dist {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup lookup(const Vars& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// The message of the std::invalid_argument read_launch_env throws ("" when it does not throw).
std::string error_of(const Vars& vars) {
  try {
    read_launch_env(lookup(vars));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

Vars torchrun() {
  return {{"RANK", "5"},
          {"WORLD_SIZE", "8"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "4"},
          {"MASTER_ADDR", "10.0.0.7"},
          {"MASTER_PORT", "29611"}};
}

Vars slurm() {
  return {{"SLURM_PROCID", "6"},
          {"SLURM_NTASKS", "7"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "3"},
          {"SLURM_TASKS_PER_NODE", "2(x3),1"},
          {"SLURM_JOB_NODELIST", "node[01-04,07],gpu3"},
          {"SLURM_JOB_ID", "123456"}};
}

TEST(LaunchEnv, NothingSetIsAPlainRun) {
  EXPECT_FALSE(read_launch_env(lookup({})).has_value());
  EXPECT_FALSE(read_launch_env(lookup({{"SLURM_JOB_ID", "17"}, {"SLURM_NTASKS", "4"}})));
}

TEST(LaunchEnv, Torchrun) {
  const auto e = read_launch_env(lookup(torchrun()));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world_size, 4);
  EXPECT_EQ(e->master_addr, "10.0.0.7");
  EXPECT_EQ(e->master_port, 29611);
  EXPECT_EQ(e->source, "torchrun");
  // No elastic variables: rank 0 hosts the store, first attempt.
  EXPECT_FALSE(e->agent_store);
  EXPECT_EQ(e->restart_count, 0);
  EXPECT_EQ(e->run_id, "none");
}

TEST(LaunchEnv, TorchrunElasticVariables) {
  Vars v = torchrun();
  v["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  v["TORCHELASTIC_RESTART_COUNT"] = "3";
  v["TORCHELASTIC_RUN_ID"] = "job-7";
  auto e = read_launch_env(lookup(v));
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->agent_store);
  EXPECT_EQ(e->restart_count, 3);
  EXPECT_EQ(e->run_id, "job-7");
  v["TORCHELASTIC_USE_AGENT_STORE"] = "False";  // what kiln launch sets
  v["TORCHELASTIC_RUN_ID"] = "";
  e = read_launch_env(lookup(v));
  EXPECT_FALSE(e->agent_store);
  EXPECT_EQ(e->run_id, "none");
}

TEST(LaunchEnv, TorchrunWithoutLocalOrMasterVariables) {
  const auto e = read_launch_env(lookup({{"RANK", "2"}, {"WORLD_SIZE", "3"}}));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->rank, 2);
  EXPECT_EQ(e->local_rank, 2);  // every rank taken to be on this node
  EXPECT_EQ(e->local_world_size, 3);
  EXPECT_EQ(e->master_addr, "127.0.0.1");
  EXPECT_EQ(e->master_port, 29500);
}

TEST(LaunchEnv, TorchrunWinsOverSlurm) {
  Vars both = slurm();
  for (const auto& [k, v] : torchrun()) both[k] = v;
  const auto e = read_launch_env(lookup(both));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->source, "torchrun");
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->master_port, 29611);
}

TEST(LaunchEnv, Slurm) {
  const auto e = read_launch_env(lookup(slurm()));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->source, "slurm");
  EXPECT_EQ(e->rank, 6);
  EXPECT_EQ(e->world_size, 7);
  EXPECT_EQ(e->local_rank, 0);
  EXPECT_EQ(e->local_world_size, 1);  // node 3 of "2(x3),1"
  EXPECT_EQ(e->master_addr, "node01");
  EXPECT_EQ(e->master_port, 10000 + 123456 % 20000);
}

TEST(LaunchEnv, SlurmTasksPerNodeForms) {
  Vars v = slurm();
  v["SLURM_PROCID"] = "3";
  v["SLURM_LOCALID"] = "1";
  v["SLURM_NODEID"] = "1";
  EXPECT_EQ(read_launch_env(lookup(v))->local_world_size, 2);  // node 1 of "2(x3),1"

  v["SLURM_TASKS_PER_NODE"] = "3,2(x2)";
  v["SLURM_NODEID"] = "2";
  EXPECT_EQ(read_launch_env(lookup(v))->local_world_size, 2);

  v.erase("SLURM_NODEID");  // without a node id: the first entry
  EXPECT_EQ(read_launch_env(lookup(v))->local_world_size, 3);

  v["SLURM_NTASKS_PER_NODE"] = "4";  // wins over SLURM_TASKS_PER_NODE, the same on every node
  v["SLURM_NTASKS"] = "8";
  v["SLURM_NODEID"] = "1";
  EXPECT_EQ(read_launch_env(lookup(v))->local_world_size, 4);

  v.erase("SLURM_NTASKS_PER_NODE");
  v.erase("SLURM_TASKS_PER_NODE");  // neither: one node
  v["SLURM_NTASKS"] = "4";
  EXPECT_EQ(read_launch_env(lookup(v))->local_world_size, 4);
}

TEST(LaunchEnv, SlurmMasterAddressAndPort) {
  Vars v = slurm();
  v.erase("SLURM_JOB_NODELIST");
  v["SLURM_NODELIST"] = "gpu[7-9]";
  EXPECT_EQ(read_launch_env(lookup(v))->master_addr, "gpu7");

  v["MASTER_ADDR"] = "head";
  v["MASTER_PORT"] = "4321";
  EXPECT_EQ(read_launch_env(lookup(v))->master_addr, "head");
  EXPECT_EQ(read_launch_env(lookup(v))->master_port, 4321);

  v.erase("MASTER_PORT");
  v["SLURM_JOB_ID"] = "20007";
  EXPECT_EQ(read_launch_env(lookup(v))->master_port, 10007);
  v.erase("SLURM_JOB_ID");
  EXPECT_EQ(read_launch_env(lookup(v))->master_port, 29500);
}

TEST(LaunchEnv, SlurmAcrossNodesNeedsAMasterHost) {
  Vars v = slurm();
  v.erase("SLURM_JOB_NODELIST");  // seven tasks on four nodes, and no way to find rank 0's
  EXPECT_NE(error_of(v).find("SLURM_JOB_NODELIST"), std::string::npos) << error_of(v);
  v["MASTER_ADDR"] = "head";
  EXPECT_EQ(read_launch_env(lookup(v))->master_addr, "head");

  v = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}};  // one node: loopback will do
  const auto e = read_launch_env(lookup(v));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->master_addr, "127.0.0.1");
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world_size, 2);
}

TEST(LaunchEnv, FirstSlurmHost) {
  EXPECT_EQ(first_slurm_host("node[01-04,07],gpu3"), "node01");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("single"), "single");
  EXPECT_EQ(first_slurm_host("n[7,3-5]"), "n7");
  EXPECT_EQ(first_slurm_host("rack[2-3]-n[008-010]"), "rack2-n008");
  EXPECT_EQ(first_slurm_host("[1-2]x"), "1x");
  EXPECT_THROW(first_slurm_host(""), std::invalid_argument);
  EXPECT_THROW(first_slurm_host("node[01-04"), std::invalid_argument);
  EXPECT_THROW(first_slurm_host("node]1"), std::invalid_argument);
  EXPECT_THROW(first_slurm_host("node[a-b]"), std::invalid_argument);
  EXPECT_THROW(first_slurm_host(",b"), std::invalid_argument);
}

TEST(LaunchEnv, MalformedValuesNameTheVariable) {
  struct Case {
    std::string variable, value;
    Vars base;
  };
  const Case cases[] = {
      {"RANK", "two", torchrun()},
      {"WORLD_SIZE", "8x", torchrun()},
      {"WORLD_SIZE", "0", torchrun()},
      {"LOCAL_RANK", "", torchrun()},
      {"LOCAL_WORLD_SIZE", "-1", torchrun()},
      {"MASTER_PORT", "70000", torchrun()},
      {"MASTER_PORT", "http", torchrun()},
      {"RANK", "-1", torchrun()},
      {"TORCHELASTIC_RESTART_COUNT", "-1", torchrun()},
      {"TORCHELASTIC_RESTART_COUNT", "one", torchrun()},
      {"TORCHELASTIC_USE_AGENT_STORE", "true", torchrun()},
      {"SLURM_PROCID", "1.5", slurm()},
      {"SLURM_NTASKS", " 7", slurm()},
      {"SLURM_LOCALID", "zero", slurm()},
      {"SLURM_TASKS_PER_NODE", "2(x3", slurm()},
      {"SLURM_TASKS_PER_NODE", "2(3),1", slurm()},
      {"SLURM_TASKS_PER_NODE", "2,,1", slurm()},
      {"SLURM_NTASKS_PER_NODE", "four", slurm()},
      {"SLURM_JOB_NODELIST", "node[01-", slurm()},
      {"SLURM_JOB_ID", "job7", slurm()},
  };
  for (const Case& c : cases) {
    Vars v = c.base;
    v[c.variable] = c.value;
    const std::string message = error_of(v);
    EXPECT_NE(message.find(c.variable), std::string::npos)
        << c.variable << "=" << c.value << ": '" << message << "'";
    EXPECT_NE(message.find("'" + c.value + "'"), std::string::npos)
        << c.variable << "=" << c.value << ": '" << message << "'";
  }
}

TEST(LaunchEnv, InconsistentValuesAreErrors) {
  Vars v = torchrun();
  v["RANK"] = "8";
  std::string message = error_of(v);
  EXPECT_NE(message.find("RANK=8"), std::string::npos) << message;
  EXPECT_NE(message.find("WORLD_SIZE=8"), std::string::npos) << message;

  v = torchrun();
  v["LOCAL_RANK"] = "4";
  message = error_of(v);
  EXPECT_NE(message.find("LOCAL_RANK=4"), std::string::npos) << message;

  v = torchrun();
  v["LOCAL_WORLD_SIZE"] = "9";
  EXPECT_NE(error_of(v).find("LOCAL_WORLD_SIZE=9"), std::string::npos) << error_of(v);

  v = torchrun();
  v.erase("WORLD_SIZE");  // a missing companion
  EXPECT_NE(error_of(v).find("WORLD_SIZE"), std::string::npos) << error_of(v);
  v = torchrun();
  v.erase("RANK");
  EXPECT_NE(error_of(v).find("RANK"), std::string::npos) << error_of(v);

  v = slurm();
  v["SLURM_PROCID"] = "7";
  message = error_of(v);
  EXPECT_NE(message.find("SLURM_PROCID=7"), std::string::npos) << message;
  EXPECT_NE(message.find("SLURM_NTASKS=7"), std::string::npos) << message;

  v = slurm();
  v["SLURM_LOCALID"] = "1";  // node 3 runs one task
  EXPECT_NE(error_of(v).find("SLURM_LOCALID=1"), std::string::npos) << error_of(v);

  v = slurm();
  v["SLURM_NODEID"] = "4";  // "2(x3),1" describes four nodes
  EXPECT_NE(error_of(v).find("SLURM_NODEID=4"), std::string::npos) << error_of(v);

  v = slurm();
  v.erase("SLURM_NTASKS");
  EXPECT_NE(error_of(v).find("SLURM_NTASKS"), std::string::npos) << error_of(v);
}

}  // namespace
}  // namespace kiln::dist
