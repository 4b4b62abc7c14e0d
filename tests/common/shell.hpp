// A shell command run to its end, as the end-to-end tests run `kiln` and the oracle scripts.
#pragma once

#include <string>

namespace kiln::test {

struct ShellResult {
  int code;            // the exit status; -1 when the command did not exit (a signal)
  std::string output;  // stdout and stderr together
};

// Runs `command` with sh, stderr joined to stdout.
ShellResult shell(const std::string& command);

}  // namespace kiln::test
