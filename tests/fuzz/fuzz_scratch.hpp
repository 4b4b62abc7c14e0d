// A per-process scratch folder for the fuzz targets whose readers take paths: in memory where
// there is /dev/shm (a file on disk per input is ten times slower), removed at exit. A crash
// leaves it behind: libFuzzer then exits without running exit handlers.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "fuzz_finding.hpp"

namespace kiln::fuzz {

class Scratch {
 public:
  // <TMPDIR, else /dev/shm, else /tmp>/kiln_<target>_XXXXXX. Aborts when it cannot be made.
  explicit Scratch(const char* target) : target_(target) {
    const char* tmp = std::getenv("TMPDIR");
    if (tmp == nullptr) tmp = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string pattern = std::string(tmp) + "/kiln_" + target + "_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) finding(target_, "setup: mkdtemp failed");
    dir_ = pattern;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Writes `size` bytes to the file `name` (replacing it) and returns its path.
  std::string write(const std::string& name, const uint8_t* data, size_t size) const {
    const std::string file = path(name);
    FILE* out = std::fopen(file.c_str(), "wb");
    if (out == nullptr) finding(target_, "setup: cannot write " + file);
    if (size > 0 && std::fwrite(data, 1, size, out) != size) {
      finding(target_, "setup: fwrite failed");
    }
    std::fclose(out);
    return file;
  }

  // Removes everything an input left in the folder.
  void clear() const {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
      std::filesystem::remove_all(entry.path(), ec);
    }
  }

 private:
  const char* target_;
  std::string dir_;
};

}  // namespace kiln::fuzz
