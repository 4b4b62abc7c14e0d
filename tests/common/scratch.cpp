#include "scratch.hpp"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "kiln_test_paths.h"

namespace kiln::test {

Scratch::Scratch() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kiln_test_XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
}

Scratch::~Scratch() {
  // The directory is flat: only the files this test and its script wrote.
  if (DIR* d = opendir(dir_.c_str())) {
    while (dirent* entry = readdir(d)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") unlink(path(name).c_str());
    }
    closedir(d);
  }
  rmdir(dir_.c_str());
}

std::string Scratch::path(const std::string& name) const { return dir_ + "/" + name; }

void Scratch::write_text(const std::string& name, const std::string& text) const {
  write_bytes(name, text.data(), text.size());
}

std::string Scratch::read_text(const std::string& name) const {
  std::ifstream in(path(name));
  if (!in) throw std::runtime_error("oracle wrote no " + name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Scratch::write_bytes(const std::string& name, const void* data, size_t size) const {
  std::ofstream out(path(name), std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) throw std::runtime_error("cannot write " + path(name));
}

void Scratch::read_bytes(const std::string& name, void* data, size_t size) const {
  std::ifstream in(path(name), std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("oracle wrote no " + name);
  if (static_cast<size_t>(in.tellg()) != size) {
    throw std::runtime_error("oracle file " + name + " has the wrong size");
  }
  in.seekg(0);
  in.read(static_cast<char*>(data), static_cast<std::streamsize>(size));
}

void Scratch::write_floats(const std::string& name, const std::vector<float>& values) const {
  write_bytes(name, values.data(), values.size() * sizeof(float));
}

std::vector<float> Scratch::read_floats(const std::string& name, size_t count) const {
  std::vector<float> values(count);
  read_bytes(name, values.data(), count * sizeof(float));
  return values;
}

std::vector<double> Scratch::read_doubles(const std::string& name, size_t count) const {
  std::vector<double> values(count);
  read_bytes(name, values.data(), count * sizeof(double));
  return values;
}

void Scratch::run(const std::string& script) const {
  const std::string command = std::string("\"") + KILN_TEST_PYTHON + "\" \"" + KILN_SOURCE_DIR +
                              "/tests/oracle/" + script + "\" \"" + dir_ + "\"";
  if (std::system(command.c_str()) != 0) throw std::runtime_error("oracle failed: " + command);
}

}  // namespace kiln::test
