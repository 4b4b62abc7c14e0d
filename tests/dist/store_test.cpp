// The rendezvous store of a process group:
// - rank 0's store listens on loopback alone when the ranks meet on loopback, and on every
//   interface when they meet at another address (other hosts must reach it);
// - in a store that outlives an attempt (torchrun's agent store, here a TCPStore the test
//   hosts), a restarted group never reads the previous attempt's keys, even when its ranks
//   arrive far apart and hold different restart counts; every key it writes is under "kiln/".
// Ranks are threads of this process on Gloo over loopback.
#include <ATen/Functions.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "dist/attempt_store.hpp"
#include "dist/launcher.hpp"
#include "dist/listen_socket.hpp"
#include "dist/process_group.hpp"
#include "listeners.hpp"

namespace kiln::dist {
namespace {

using namespace std::chrono_literals;

using kiln::test::listeners;

bool is_wildcard(const std::string& hex) { return hex.find_first_not_of('0') == std::string::npos; }

// An IPv4 address of this host outside loopback, or "" when it has none.
std::string non_loopback_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    if (!is_loopback(text)) found = text;
  }
  freeifaddrs(list);
  return found;
}

GroupOptions one_rank(const std::string& addr, int port) {
  GroupOptions o;
  o.master_addr = addr;
  o.port = port;
  o.timeout = 20s;
  return o;
}

TEST(Store, LoopbackAddresses) {
  for (const char* yes : {"127.0.0.1", "127.1.2.3", "localhost", "::1"}) {
    EXPECT_TRUE(is_loopback(yes)) << yes;
  }
  for (const char* no : {"10.0.0.1", "0.0.0.0", "::", "127.example.org", "node01", ""}) {
    EXPECT_FALSE(is_loopback(no)) << no;
  }
}

TEST(Store, ListenOnLoopback) {
  const int fd = listen_on_loopback("localhost", 0);
  sockaddr_in addr{};
  socklen_t length = sizeof addr;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  EXPECT_EQ(ntohl(addr.sin_addr.s_addr), INADDR_LOOPBACK);
  const int port = ntohs(addr.sin_port);
  // The port is taken: the error names address and port.
  try {
    close(listen_on_loopback("127.0.0.1", port));
    ADD_FAILURE() << "a second listener on 127.0.0.1:" << port;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
  close(fd);
  EXPECT_THROW(listen_on_loopback("10.0.0.1", 0), std::invalid_argument);
}

TEST(Store, RankZeroListensOnLoopbackWhenTheRanksMeetThere) {
  const int port = free_port();
  ProcessGroup group(one_rank("127.0.0.1", port));
  const std::vector<std::string> addresses = listeners(port);
  ASSERT_FALSE(addresses.empty());
  for (const std::string& a : addresses) EXPECT_EQ(a, "0100007F");  // 127.0.0.1
}

TEST(Store, RankZeroListensOnEveryInterfaceWhenTheRanksMeetElsewhere) {
  const std::string address = non_loopback_address();
  if (address.empty()) GTEST_SKIP() << "this host has no IPv4 address outside loopback";
  const int port = free_port();
  ProcessGroup group(one_rank(address, port));
  const std::vector<std::string> addresses = listeners(port);
  ASSERT_FALSE(addresses.empty());
  for (const std::string& a : addresses) EXPECT_TRUE(is_wildcard(a)) << a;
}

// The test's own store, kept across attempts as torchrun's agent keeps its.
c10::intrusive_ptr<c10d::TCPStore> agent_store(int port) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = 20s;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
}

// One attempt of a 2-rank group on the agent's store: rank 1 joins at once, rank 0 after
// `rank0_delay`; each all-reduces rank + 1. The sums (3 when the group works).
std::vector<float> attempt(int port, std::chrono::milliseconds rank0_delay,
                           const int restart_count[2]) {
  std::vector<float> sums(2, 0.0f);
  std::string errors[2];
  auto rank_main = [&](int rank) {
    try {
      if (rank == 0) std::this_thread::sleep_for(rank0_delay);
      GroupOptions o = one_rank("127.0.0.1", port);
      o.rank = rank;
      o.world_size = 2;
      o.agent_store = true;
      o.restart_count = restart_count[rank];
      ProcessGroup group(o);
      at::Tensor t = at::full({1}, static_cast<float>(rank + 1));
      group.allreduce(t, "sum");
      sums[static_cast<size_t>(rank)] = t.item<float>();
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::thread one(rank_main, 1);
  rank_main(0);
  one.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  return sums;
}

TEST(Store, ARestartedGroupIgnoresTheEarlierAttemptsKeys) {
  const int port = free_port();
  auto agent = agent_store(port);
  const int first[2] = {0, 0};
  EXPECT_EQ(attempt(port, 0ms, first), std::vector<float>({3.0f, 3.0f}));
  // Restarted rank 1 comes a second before rank 0: the keys it finds are attempt 0's (rank 0's
  // Gloo address among them, a closed port). Only the agent whose rank failed counted it.
  const int second[2] = {0, 1};
  EXPECT_EQ(attempt(port, 1000ms, second), std::vector<float>({3.0f, 3.0f}));
  const int third[2] = {2, 1};
  EXPECT_EQ(attempt(port, 500ms, third), std::vector<float>({3.0f, 3.0f}));
  for (const std::string& key : agent->listKeys()) {
    EXPECT_EQ(key.rfind("kiln/none/", 0), 0u) << key;
  }
}

TEST(Store, ARankMissingFromTheAttemptTimesOut) {
  // Rank 0's slot holds an earlier attempt's nonce and rank 0 never comes back.
  const int port = free_port();
  auto agent = agent_store(port);
  const std::string earlier = "an earlier attempt";
  agent->set("kiln/none/slot/0", std::vector<uint8_t>(earlier.begin(), earlier.end()));
  const auto start = std::chrono::steady_clock::now();
  try {
    attempt_store(agent, "none", 1, 2, 1500ms);
    ADD_FAILURE() << "joined without rank 0";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("did not all join this attempt within 1.5 s"),
              std::string::npos)
        << e.what();
  }
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 5.0);
}

}  // namespace
}  // namespace kiln::dist
