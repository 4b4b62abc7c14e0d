// IDX files, the MNIST family's format: a big-endian magic 0x0000 <type> <rank>, `rank` big-endian
// u32 dimensions, then the elements. Read as files from elsewhere: torch-free, so the reader is
// fuzzed as it is (tests/fuzz/idx_fuzz.cpp); data/dataset.hpp builds tensors from it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kiln::data {

struct IdxBytes {
  std::vector<uint64_t> dims;  // as the header gives them
  std::vector<uint8_t> data;   // exactly the product of dims bytes
};

// Reads `path`, gzip-compressed or plain, which must hold a `rank`-dimensional array of unsigned
// bytes (magic 0x0000080<rank>). `kind` ("image", "label") names the file in the bad-magic message
// and `what` ("pixel data") the payload in the others. The dimensions' product is checked for
// overflow, and the data is read as it arrives: a header claiming more than the file holds costs
// no more memory than the file, and is an error ("truncated"), as are bytes past what the header
// claims and a gzip stream that fails its CRC. Throws io::BadFileError "<path>: ...".
IdxBytes read_idx_ubyte(const std::string& path, uint32_t rank, const char* kind, const char* what);

// The same for any rank in [min_rank, max_rank] (images: 3 for N x H x W, 4 for N x C x H x W).
// `check_dims`, when given, sees the header's dimensions before any data is read (and may throw):
// a gzip stream's data can be far larger than the file, so a limit on it is applied there.
IdxBytes read_idx_ubyte(const std::string& path, uint32_t min_rank, uint32_t max_rank,
                        const char* kind, const char* what,
                        const std::function<void(const std::vector<uint64_t>&)>& check_dims = {});

}  // namespace kiln::data
