// libFuzzer target: arbitrary bytes as a safetensors file through
// kiln::io::read_safetensors_layout, every check io/safetensors.cpp makes before it allocates a
// tensor and reads its bytes.
//
// A BadFileError is the expected answer to a bad file. Anything else aborts, and so is a finding:
// another exception type, a sanitizer report, or an accepted layout that breaks what the
// allocation relies on (re-checked here by division, not the reader's own arithmetic): a shape
// whose size does not fit int64_t, a range that does not hold exactly that size, ranges that
// leave a gap or overlap or do not end at the file's end, a name twice, bytes that cannot be read.
#include <cstdint>
#include <exception>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_finding.hpp"
#include "io/safetensors_layout.hpp"
#include "io/untrusted.hpp"

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

[[noreturn]] void finding(const std::string& what) {
  kiln::fuzz::finding("safetensors_fuzz", what);
}

// The entry's byte count, or -1 when it (or the product of its non-zero dimensions) would not
// fit int64_t.
int64_t bytes_of(const kiln::io::SafetensorsEntry& e) {
  int64_t bound = 1;
  bool empty = false;
  for (const int64_t d : e.shape) {
    if (d < 0) finding("accepted negative dimension in '" + e.name + "'");
    if (d == 0) {
      empty = true;
    } else if (bound > kInt64Max / d) {
      return -1;
    } else {
      bound *= d;
    }
  }
  const auto size = static_cast<int64_t>(kiln::io::safetensors_element_size(e.dtype));
  if (size == 0) finding("accepted unknown dtype in '" + e.name + "'");
  if (empty) return 0;
  return bound > kInt64Max / size ? -1 : bound * size;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  kiln::io::SafetensorsLayout layout;
  try {
    layout = kiln::io::read_safetensors_layout(in, size, "fuzz.safetensors");
  } catch (const kiln::io::BadFileError&) {
    return 0;  // a rejected file: the expected outcome for most inputs
  } catch (const std::exception& e) {
    finding(std::string("read_safetensors_layout threw a non-BadFileError exception: ") + e.what());
  }

  if (size < 8 || layout.data_start < 8 || layout.data_start > size) {
    finding("data starts outside the file");
  }
  uint64_t covered = 0;
  std::set<std::string> names;
  for (const auto& e : layout.entries) {
    if (!names.insert(e.name).second) finding("accepted '" + e.name + "' twice");
    const int64_t bytes = bytes_of(e);
    if (bytes < 0) finding("accepted a shape whose size overflows in '" + e.name + "'");
    if (e.begin != covered || e.end < e.begin || e.end - e.begin != static_cast<uint64_t>(bytes)) {
      finding("accepted a range with a gap, an overlap or the wrong size in '" + e.name + "'");
    }
    covered = e.end;
  }
  if (covered != size - layout.data_start) finding("the ranges do not end at the file's end");

  // Read each tensor's bytes the way io/safetensors.cpp does, into a buffer of exactly its size.
  for (const auto& e : layout.entries) {
    std::vector<char> buffer(e.end - e.begin);
    in.clear();
    in.seekg(static_cast<std::streamoff>(layout.data_start + e.begin));
    if (!in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()))) {
      finding("an accepted range cannot be read in '" + e.name + "'");
    }
  }
  return 0;
}
