// The Python torch oracle: a scratch directory of raw little-endian arrays, a config file, and
// a script from tests/oracle run with KILN_TEST_PYTHON to write torch's answers next to them.
// Plain POSIX file handling: libtorch.so exports a broken copy of std::filesystem (remove_all
// jumps to NULL) that would interpose on libstdc++'s.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace kiln::test {

class OracleDir {
 public:
  OracleDir();   // creates a fresh temporary directory
  ~OracleDir();  // removes it
  OracleDir(const OracleDir&) = delete;
  OracleDir& operator=(const OracleDir&) = delete;

  // Writes `t` (any layout) as raw contiguous values of its dtype to `name`.
  void write(const std::string& name, const at::Tensor& t) const;
  // Reads `name` as float32 (or float64 when `dtype` says so) values shaped `shape`.
  at::Tensor read(const std::string& name, at::IntArrayRef shape,
                  at::ScalarType dtype = at::kFloat) const;
  // Writes a text file (the script's JSON config).
  void write_text(const std::string& name, const std::string& text) const;
  // Runs tests/oracle/`script` with this directory as its argument; throws when it fails.
  void run(const std::string& script) const;

 private:
  std::string dir_;
};

// Max |a - e| / (atol + rtol * |e|) over all elements: <= 1 means close.
double closeness(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol);

}  // namespace kiln::test
