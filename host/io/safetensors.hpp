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

}  // namespace kiln::io
