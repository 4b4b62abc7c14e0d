// The Python oracle's scratch directory (after tests/plugins/oracle.hpp, plus text files):
// raw little-endian arrays, a config file, and a script from tests/oracle run with
// KILN_TEST_PYTHON to write torch's answers next to them. Plain POSIX file handling: libtorch.so
// exports a broken copy of std::filesystem that would interpose on libstdc++'s.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace kiln::test {

class Scratch {
 public:
  Scratch();   // creates a fresh temporary directory
  ~Scratch();  // removes it
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // Writes `t` (any layout) as raw contiguous values of its dtype to `name`.
  void write(const std::string& name, const at::Tensor& t) const;
  // Reads `name` as float32 values shaped `shape`; throws when absent or of another size.
  at::Tensor read(const std::string& name, const std::vector<int64_t>& shape) const;
  void write_text(const std::string& name, const std::string& text) const;
  // The text of `name`; throws when absent.
  std::string read_text(const std::string& name) const;
  // Runs tests/oracle/`script` with this directory as its argument; throws when it fails.
  void run(const std::string& script) const;

 private:
  std::string dir_;
};

}  // namespace kiln::test
