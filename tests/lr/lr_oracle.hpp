// The Python oracle for the lr tests: a scratch directory with config.json, a script from
// tests/oracle run once with KILN_TEST_PYTHON, and the float64 arrays it writes back.
#pragma once

#include <string>
#include <vector>

namespace kiln::lr_test {

class Oracle {
 public:
  Oracle();   // a fresh temporary directory
  ~Oracle();  // removed with everything in it
  Oracle(const Oracle&) = delete;
  Oracle& operator=(const Oracle&) = delete;

  // Writes `json` as config.json and runs tests/oracle/`script` on the directory.
  void run(const std::string& script, const std::string& json) const;
  // Reads `name` as exactly `count` little-endian float64 values.
  std::vector<double> read(const std::string& name, size_t count) const;

 private:
  std::string dir_;
};

}  // namespace kiln::lr_test
