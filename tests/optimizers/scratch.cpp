#include "scratch.hpp"

#include <ATen/ops/empty.h>
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
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kiln_optim_XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
}

Scratch::~Scratch() {
  // The directory is flat: only the files this test and its script wrote.
  if (DIR* d = opendir(dir_.c_str())) {
    while (dirent* entry = readdir(d)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") unlink((dir_ + "/" + name).c_str());
    }
    closedir(d);
  }
  rmdir(dir_.c_str());
}

void Scratch::write(const std::string& name, const at::Tensor& t) const {
  at::Tensor c = t.detach().cpu().contiguous();
  std::ofstream out(dir_ + "/" + name, std::ios::binary);
  out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  if (!out) throw std::runtime_error("cannot write " + dir_ + "/" + name);
}

at::Tensor Scratch::read(const std::string& name, const std::vector<int64_t>& shape) const {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  std::ifstream in(dir_ + "/" + name, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("oracle wrote no " + name);
  if (static_cast<size_t>(in.tellg()) != t.nbytes()) {
    throw std::runtime_error("oracle file " + name + " has the wrong size");
  }
  in.seekg(0);
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  return t;
}

void Scratch::write_text(const std::string& name, const std::string& text) const {
  std::ofstream(dir_ + "/" + name) << text;
}

std::string Scratch::read_text(const std::string& name) const {
  std::ifstream in(dir_ + "/" + name);
  if (!in) throw std::runtime_error("oracle wrote no " + name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Scratch::run(const std::string& script) const {
  const std::string command = std::string("\"") + KILN_TEST_PYTHON + "\" \"" + KILN_SOURCE_DIR +
                              "/tests/oracle/" + script + "\" \"" + dir_ + "\"";
  if (std::system(command.c_str()) != 0) throw std::runtime_error("oracle failed: " + command);
}

}  // namespace kiln::test
