// Writes tensors as a safetensors file (the format Python's `safetensors` and Hugging Face read:
// an 8-byte little-endian header length, a JSON header of dtype/shape/byte range per tensor, then
// the raw data), atomically: a temporary file in the same folder, fsynced, then renamed.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln::io {

// Throws std::runtime_error naming `path` and the reason when it cannot be written; an existing
// file at `path` is then left as it was.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A safetensors file's tensors (CPU, in the order of their data) and its metadata.
struct SafetensorsFile {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> metadata;
  const at::Tensor* find(const std::string& name) const;  // nullptr when absent
};

// Reads `path`, a file from anywhere: its header is checked against the file before anything is
// allocated (io/safetensors_layout.hpp lists the checks). Throws BadFileError (a
// std::runtime_error) naming the path, the tensor at fault and what is wrong: missing, truncated,
// a header that is not JSON, an unknown dtype, a shape whose size overflows, byte ranges that do
// not match the shapes or do not tile the file's data.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace kiln::io
