// libFuzzer target: arbitrary bytes as an IDX file through kiln::data::read_idx_ubyte, which
// data/dataset.cpp turns into image and label tensors.
//
// Input: one mode byte, then the file. Mode bit 0: gzip the file before reading it (so the
// fuzzer reaches the header checks of compressed files without having to find valid deflate
// streams); bit 1: read it as labels (rank 1) rather than images (rank 3).
//
// A BadFileError is the expected answer to a bad file. Anything else aborts, and so is a finding:
// another exception type, a sanitizer report, or an accepted file whose data is not exactly the
// product of its dimensions.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>

#include "data/idx.hpp"
#include "fuzz_finding.hpp"
#include "io/untrusted.hpp"

namespace {

// gzopen reads files, so each input is written to one scratch file first.
std::string scratch_dir, scratch_file;

[[noreturn]] void finding(const std::string& what) { kiln::fuzz::finding("idx_fuzz", what); }

void remove_scratch() {
  std::remove(scratch_file.c_str());
  ::rmdir(scratch_dir.c_str());
}

void write_input(const uint8_t* data, size_t size, bool gzip) {
  if (gzip) {
    gzFile out = gzopen(scratch_file.c_str(), "wb");
    if (out == nullptr) finding("setup: cannot write " + scratch_file);
    if (size > 0 && gzwrite(out, data, static_cast<unsigned>(size)) != static_cast<int>(size)) {
      finding("setup: gzwrite failed");
    }
    gzclose(out);
    return;
  }
  FILE* out = std::fopen(scratch_file.c_str(), "wb");
  if (out == nullptr) finding("setup: cannot write " + scratch_file);
  if (size > 0 && std::fwrite(data, 1, size, out) != size) finding("setup: fwrite failed");
  std::fclose(out);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // In memory where there is /dev/shm: a file on disk per input is ten times slower.
  const char* tmp = std::getenv("TMPDIR");
  if (tmp == nullptr) tmp = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  std::string pattern = std::string(tmp) + "/kiln_idx_fuzz_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) finding("setup: mkdtemp failed");
  scratch_dir = pattern;
  scratch_file = scratch_dir + "/input";
  std::atexit(remove_scratch);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const uint32_t rank = (mode & 2) != 0 ? 1 : 3;
  write_input(data + 1, size - 1, (mode & 1) != 0);
  kiln::data::IdxBytes idx;
  try {
    idx = kiln::data::read_idx_ubyte(scratch_file, rank, rank == 1 ? "label" : "image", "data");
  } catch (const kiln::io::BadFileError&) {
    return 0;  // a rejected file: the expected outcome for most inputs
  } catch (const std::exception& e) {
    finding(std::string("read_idx_ubyte threw a non-BadFileError exception: ") + e.what());
  }
  if (idx.dims.size() != rank) finding("accepted a header with the wrong rank");
  uint64_t product = 1;
  for (const uint64_t d : idx.dims) {
    if (d != 0 && product > std::numeric_limits<uint64_t>::max() / d) {
      finding("accepted dimensions whose product overflows");
    }
    product *= d;
  }
  if (idx.data.size() != product) finding("accepted data that is not the dimensions' product");
  return 0;
}
