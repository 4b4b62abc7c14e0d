// Running the built `kiln` from a test, and the test pipelines it reads (tests/pipelines).
#pragma once

#include <string>

#include "kiln_test_paths.h"
#include "shell.hpp"

namespace kiln::test {

// `kiln <args>` with `env` (VAR=value ...) before it; stdout and stderr together.
inline ShellResult kiln_cli(const std::string& args, const std::string& env = "") {
  return shell(env + " " KILN_CLI " " + args);
}

// tests/pipelines/<name>.
inline std::string pipeline(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/tests/pipelines/" + name;
}

}  // namespace kiln::test
