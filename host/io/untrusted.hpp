// Reading files a user may have been handed (model.init weights, checkpoints, IDX data): every
// size, count, offset or shape taken from such a file goes through these checks before it enters
// arithmetic or an allocation, and a file that fails one is a BadFileError naming the file.
// Torch-free, so the readers' parsers build into the libFuzzer targets (tests/fuzz).
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kiln::io {

// A file that is not what it claims to be; what() is "<path>: <reason>" (and the tensor or field).
class BadFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The largest element or byte count a reader accepts: what int64_t (tensor sizes, file offsets)
// holds.
inline constexpr uint64_t kMaxCount = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// a * b and a + b, or nullopt when the result does not fit in uint64_t.
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}
inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

// The element count of `shape`, or nullopt when a dimension is negative or the product of the
// non-zero dimensions exceeds kMaxCount. Zero dimensions are skipped in that bound (not in the
// count) because a tensor's strides are products of the other dimensions all the same:
// [2^62, 2^62, 0] holds nothing but has no strides that fit.
template <class Int>
std::optional<uint64_t> checked_numel(const std::vector<Int>& shape) {
  uint64_t bound = 1;
  bool empty = false;
  for (const Int d : shape) {
    if constexpr (std::is_signed_v<Int>) {
      if (d < 0) return std::nullopt;
    }
    if (d == 0) {
      empty = true;
      continue;
    }
    const std::optional<uint64_t> next = checked_mul(bound, static_cast<uint64_t>(d));
    if (!next || *next > kMaxCount) return std::nullopt;
    bound = *next;
  }
  return empty ? 0 : bound;
}

// A name or value from a file, quoted for an error message: control bytes as \xNN, so a hostile
// name cannot rewrite the terminal (UTF-8 text stays readable).
inline std::string quote_name(std::string_view text) {
  std::string out = "'";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "'";
}

// "[4, 3, 2]", for messages about a shape.
template <class Int>
std::string shape_text(const std::vector<Int>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace kiln::io
