#include "lr_oracle.hpp"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <stdexcept>

#include "kiln_test_paths.h"

namespace kiln::lr_test {

Oracle::Oracle() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kiln_lr_oracle_XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
}

Oracle::~Oracle() {
  // The directory is flat: config.json and the script's outputs.
  if (DIR* d = opendir(dir_.c_str())) {
    while (dirent* entry = readdir(d)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") unlink((dir_ + "/" + name).c_str());
    }
    closedir(d);
  }
  rmdir(dir_.c_str());
}

void Oracle::run(const std::string& script, const std::string& json) const {
  std::ofstream(dir_ + "/config.json") << json;
  const std::string command = std::string("\"") + KILN_TEST_PYTHON + "\" \"" + KILN_SOURCE_DIR +
                              "/tests/oracle/" + script + "\" \"" + dir_ + "\"";
  if (std::system(command.c_str()) != 0) throw std::runtime_error("oracle failed: " + command);
}

std::vector<double> Oracle::read(const std::string& name, size_t count) const {
  std::ifstream in(dir_ + "/" + name, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("oracle wrote no " + name);
  if (static_cast<size_t>(in.tellg()) != count * sizeof(double)) {
    throw std::runtime_error("oracle file " + name + " has the wrong size");
  }
  std::vector<double> values(count);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(values.data()),
          static_cast<std::streamsize>(count * sizeof(double)));
  return values;
}

}  // namespace kiln::lr_test
