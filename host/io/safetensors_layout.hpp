// The checked layout of a safetensors file: its header read and verified against the file before
// any tensor is allocated. Torch-free (io/safetensors.cpp allocates and fills the tensors), so it
// is fuzzed as it is (tests/fuzz/safetensors_fuzz.cpp).
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::io {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;            // safetensors' code: "F32", "BF16", ...
  std::vector<int64_t> shape;   // each >= 0; the non-zero ones multiply to at most kMaxCount
  uint64_t begin = 0, end = 0;  // byte range within the data, end - begin = numel * dtype size
};

struct SafetensorsLayout {
  uint64_t data_start = 0;                // 8 + the header's length
  std::vector<SafetensorsEntry> entries;  // in the order of their data
  std::map<std::string, std::string> metadata;
};

// The bytes per element of a dtype code this reader knows, or 0.
size_t safetensors_element_size(std::string_view code);

// safetensors' own limit on the header (the Rust reference implementation's MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// Reads the header of a safetensors file of `file_size` bytes from `in` (positioned at its
// start) and checks it against the file the way the reference implementation does: a JSON object
// of at most three levels; each tensor's dtype known, shape non-negative integers whose byte count
// fits 64 bits, data_offsets [begin, end] that hold exactly that many bytes; the tensors' ranges
// tiling the data after the header with no gap or overlap, to its last byte; names unique.
// Throws BadFileError "<path>: ..." naming the tensor where one is at fault.
SafetensorsLayout read_safetensors_layout(std::istream& in, uint64_t file_size,
                                          const std::string& path);

}  // namespace kiln::io
