// How a fuzz target reports a finding: the message on stderr, then abort(), which libFuzzer
// (and the replay driver under ctest) treat as a crash with the input saved.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kiln::fuzz {

[[noreturn]] inline void finding(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", target, what.c_str());
  std::abort();
}

}  // namespace kiln::fuzz
