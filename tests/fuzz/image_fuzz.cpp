// libFuzzer target: arbitrary bytes as an image file through the image_folder dataset's
// decoders (plugins/dataset/image_folder/image.cpp: JPEG by libjpeg-turbo, PNG by libpng):
// probe_image, then decode_image into a buffer of the size the header claims, and into one a
// byte too small.
//
// Input: one mode byte, then the file. Mode bits 0-1: the scale denominator asked for (1, 2, 4
// or 8); bit 2: decode to gray (1 channel) rather than RGB (3); bits 3-4: the pixel limit
// (data.max_image_pixels): none, 2^20, 256 or 1.
//
// A kiln::Error is the expected answer to a bad file. Anything else aborts, and so is a finding:
// another exception type, a sanitizer report, a write past the buffer (it ends where a page the
// process cannot write begins, since libjpeg and libpng are not instrumented), a too-small
// buffer accepted or written to, an image decoded that the pixel limit refuses, or a decoded
// size other than the header's at the scale used.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include "fuzz_finding.hpp"
#include "fuzz_scratch.hpp"
#include "image.hpp"
#include "kiln/dataset.h"
#include "kiln/sdk.hpp"

namespace {

using kiln::image_folder::Decoded;
using kiln::image_folder::Header;

// Decodes only headers of at most this many pixels: one claiming 65000 x 65000 is a valid
// header, but its 12 GB buffer is not what the target is about.
constexpr uint64_t kMaxPixels = uint64_t{1} << 20;
// The too-small buffer's cap: its refusal comes before any decoding, whatever the claim.
constexpr uint64_t kMaxTooSmall = 64 * 1024;
constexpr uint8_t kFill = 0xA5;

[[noreturn]] void finding(const std::string& what) { kiln::fuzz::finding("image_fuzz", what); }

const kiln::fuzz::Scratch& scratch() {
  static const kiln::fuzz::Scratch s("image_fuzz");
  return s;
}

// `size` bytes filled with kFill that end where a PROT_NONE page begins, so a write past them
// faults even from the uninstrumented libraries.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t size) : size_(size) {
    const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t body = (size + page - 1) / page * page;
    length_ = body + page;
    void* p = ::mmap(nullptr, length_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) finding("setup: mmap failed");
    base_ = static_cast<uint8_t*>(p);
    if (::mprotect(base_ + body, page, PROT_NONE) != 0) finding("setup: mprotect failed");
    data_ = base_ + body - size;
    std::memset(data_, kFill, size);
  }
  ~GuardedBuffer() { ::munmap(base_, length_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  uint8_t* data() const { return data_; }
  bool untouched() const {
    return std::all_of(data_, data_ + size_, [](uint8_t b) { return b == kFill; });
  }

 private:
  size_t size_;
  size_t length_ = 0;
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
};

// The target's one call of decode_image, so a change of its parameters is made here alone.
Decoded decode(const std::string& path, int scale, int channels, uint8_t* pixels, size_t capacity,
               uint64_t max_pixels) {
  return kiln::image_folder::decode_image(path, scale, channels, pixels, capacity, max_pixels);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  scratch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int scale = 1 << (data[0] & 3);
  const int channels = (data[0] & 4) != 0 ? 1 : 3;
  static constexpr uint64_t kLimits[] = {0, kMaxPixels, 256, 1};
  const uint64_t limit = kLimits[(data[0] >> 3) & 3];
  const std::string path = scratch().write("input", data + 1, size - 1);
  const bool png = size > 1 && data[1] == 0x89;  // a JPEG starts with 0xFF

  Header h;
  try {
    h = kiln::image_folder::probe_image(path);
  } catch (const kiln::Error&) {
    return 0;  // a rejected file: the expected outcome for most inputs
  } catch (const std::exception& e) {
    finding(std::string("probe_image threw a non-kiln::Error exception: ") + e.what());
  }
  if (h.height <= 0 || h.width <= 0 || h.height > 0x7fffffff || h.width > 0x7fffffff ||
      (h.channels != 1 && h.channels != 3)) {
    finding("probe_image gave " + std::to_string(h.height) + " x " + std::to_string(h.width) +
            " x " + std::to_string(h.channels));
  }
  const uint64_t pixels = static_cast<uint64_t>(h.height) * static_cast<uint64_t>(h.width);
  const uint64_t need = pixels * static_cast<uint64_t>(channels);  // < 2^64: sides < 2^31

  // A byte too few at full scale: refused before anything is written.
  {
    const auto capacity = static_cast<size_t>(std::min(need - 1, kMaxTooSmall));
    GuardedBuffer small(capacity);
    try {
      decode(path, 1, channels, small.data(), capacity, limit);
      finding("decode_image accepted a buffer of " + std::to_string(capacity) + " bytes for " +
              std::to_string(need));
    } catch (const kiln::Error&) {
    } catch (const std::exception& e) {
      finding(std::string("decode_image (too small) threw a non-kiln::Error exception: ") +
              e.what());
    }
    if (!small.untouched()) finding("decode_image wrote into a buffer it refused");
  }

  if (pixels > kMaxPixels) return 0;
  GuardedBuffer buffer(static_cast<size_t>(need));
  Decoded d;
  try {
    d = decode(path, scale, channels, buffer.data(), static_cast<size_t>(need), limit);
  } catch (const kiln::Error&) {
    return 0;  // a header that parses over data that does not
  } catch (const std::exception& e) {
    finding(std::string("decode_image threw a non-kiln::Error exception: ") + e.what());
  }
  if (kiln_pixel_limit(static_cast<uint64_t>(h.height), static_cast<uint64_t>(h.width), limit) ==
      KILN_PIXELS_REFUSE) {
    finding("decode_image decoded " + std::to_string(pixels) + " pixels under a limit of " +
            std::to_string(limit));
  }
  // JPEG reduces by a d dividing the scale asked for (ceil of each side); PNG decodes at d = 1.
  if (d.scale < 1 || scale % d.scale != 0 || (png && d.scale != 1)) {
    finding("decode_image used scale 1/" + std::to_string(d.scale) + " for 1/" +
            std::to_string(scale));
  }
  if (d.height != (h.height + d.scale - 1) / d.scale ||
      d.width != (h.width + d.scale - 1) / d.scale) {
    finding("decode_image gave " + std::to_string(d.height) + " x " + std::to_string(d.width) +
            " at 1/" + std::to_string(d.scale) + " of a header's " + std::to_string(h.height) +
            " x " + std::to_string(h.width));
  }
  return 0;
}
