// The Python oracle's scratch directory: raw little-endian arrays and a config file written by
// the test, a script from tests/oracle run with KILN_TEST_PYTHON on the directory, and the
// arrays it writes back. Plain POSIX file handling: libtorch.so exports a broken copy of
// std::filesystem (remove_all jumps to NULL) that would interpose on libstdc++'s.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kiln::test {

class Scratch {
 public:
  Scratch();   // creates a fresh temporary directory
  ~Scratch();  // removes it with everything in it
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // `dir`/`name`.
  std::string path(const std::string& name) const;

  void write_text(const std::string& name, const std::string& text) const;
  // The text of `name`; throws when absent.
  std::string read_text(const std::string& name) const;

  // Writes `size` raw bytes to `name`; throws when it cannot.
  void write_bytes(const std::string& name, const void* data, size_t size) const;
  // Reads `name` into `data`, which must be exactly `size` bytes; throws when absent or of
  // another size.
  void read_bytes(const std::string& name, void* data, size_t size) const;

  void write_floats(const std::string& name, const std::vector<float>& values) const;
  // Exactly `count` float32 / float64 values.
  std::vector<float> read_floats(const std::string& name, size_t count) const;
  std::vector<double> read_doubles(const std::string& name, size_t count) const;

  // Runs tests/oracle/`script` with this directory as its argument; throws when it fails.
  void run(const std::string& script) const;

 private:
  std::string dir_;
};

}  // namespace kiln::test
