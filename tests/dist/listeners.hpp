// The sockets listening on a TCP port, as the kernel lists them, for tests of where a store
// listens.
#pragma once

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kiln::test {

// Local addresses (hex, as /proc/net/tcp{,6} write them) of the sockets listening on `port`.
inline std::vector<std::string> listeners(int port) {
  std::vector<std::string> out;
  char hex_port[8];
  std::snprintf(hex_port, sizeof hex_port, "%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const size_t colon = local.find(':');
      if (state == "0A" && local.substr(colon + 1) == hex_port) {
        out.push_back(local.substr(0, colon));
      }
    }
  }
  return out;
}

}  // namespace kiln::test
