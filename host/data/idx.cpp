#include "data/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "io/untrusted.hpp"

namespace kiln::data {
namespace {

using io::BadFileError;

BadFileError error(const std::string& path, const std::string& what) {
  return BadFileError(path + ": " + what);
}

std::string hex32(uint32_t value) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", value);
  return buf;
}

// A gzip (or plain: zlib passes those through) file, closed on scope exit.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      const int err = errno;
      throw error(path,
                  std::string("cannot open: ") + (err != 0 ? std::strerror(err) : "out of memory"));
    }
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `size` bytes; returns how many arrived (fewer only at end of file).
  uint64_t read(void* dst, uint64_t size) {
    auto* out = static_cast<unsigned char*>(dst);
    uint64_t done = 0;
    while (done < size) {
      // gzread takes an unsigned int length, so large payloads go in chunks.
      const unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(size - done, 1u << 30));
      const int got = gzread(file_, out + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        throw error(path_, std::string("read error: ") + (msg != nullptr ? msg : "unknown"));
      }
      if (got == 0) break;
      done += static_cast<uint64_t>(got);
    }
    return done;
  }

  uint32_t read_u32_be() {
    unsigned char b[4];
    const uint64_t got = read(b, 4);
    if (got != 4) {
      throw error(path_, "truncated: expected 4 bytes of header, got " + std::to_string(got));
    }
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

// The buffer grows by what arrives (doubling from 64 KiB), so memory follows the file, not the
// header's claim.
constexpr uint64_t kFirstChunk = uint64_t{1} << 16;

}  // namespace

IdxBytes read_idx_ubyte(const std::string& path, uint32_t rank, const char* kind,
                        const char* what) {
  return read_idx_ubyte(path, rank, rank, kind, what);
}

IdxBytes read_idx_ubyte(const std::string& path, uint32_t min_rank, uint32_t max_rank,
                        const char* kind, const char* what,
                        const std::function<void(const std::vector<uint64_t>&)>& check_dims) {
  GzReader in(path);
  const uint32_t magic = in.read_u32_be();
  const uint32_t rank = magic & 0xffu;
  if ((magic & ~0xffu) != 0x800u || rank < min_rank || rank > max_rank) {
    throw error(path, std::string("not an IDX ") + kind + " file (magic " + hex32(magic) + ")");
  }
  IdxBytes out;
  for (uint32_t k = 0; k < rank; ++k) out.dims.push_back(in.read_u32_be());
  const std::optional<uint64_t> claimed = io::checked_numel(out.dims);
  if (!claimed) {
    std::string text;
    for (uint64_t d : out.dims) text += (text.empty() ? "" : "x") + std::to_string(d);
    throw error(path, "dimensions " + text + " overflow 64 bits");
  }
  if (check_dims) check_dims(out.dims);
  while (out.data.size() < *claimed) {
    const uint64_t have = out.data.size();
    const uint64_t want = std::min(*claimed - have, std::max<uint64_t>(kFirstChunk, have));
    out.data.resize(have + want);
    const uint64_t got = in.read(out.data.data() + have, want);
    out.data.resize(have + got);
    if (got < want) {
      throw error(path, "truncated: expected " + std::to_string(*claimed) + " bytes of " + what +
                            ", got " + std::to_string(out.data.size()));
    }
  }
  unsigned char extra = 0;
  if (in.read(&extra, 1) != 0) {
    throw error(path, "more data than the header's " + std::to_string(*claimed) + " bytes of " +
                          what + " (dimensions wrong, or another file appended?)");
  }
  return out;
}

}  // namespace kiln::data
