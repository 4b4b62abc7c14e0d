// libFuzzer target: arbitrary bytes as the files of a cifar10 or cifar100 root folder through
// the component's slots (plugins/dataset/formats/cifar.cpp, as the host's adapter calls them):
// create, info, then probe, decode and targets of the first, a middle and the last sample.
//
// Input: a mode byte, a byte per file the split opens, then the files' bytes in turn (zeros
// once the input runs out, so that a short input still makes whole records; a missing file
// byte is 1). Mode bit 0: cifar100 (else cifar10); bit 1: the val split (else train, cifar10's
// five batches); bit 2: cifar100's coarse label (else fine); bit 3: each file cut to half its
// size after create, as if it changed under the loader. A file's byte: bits 0-1 its records (0
// to 3); bit 2: no file; bit 3: a folder in its place; bit 4: a byte more; bit 5: a byte fewer.
//
// Refusals (INVALID_ARGUMENT, DATA_LOSS) are the expected answers to bad files. Anything else
// aborts, and so is a finding: another status (an exception other than kiln::Error), a sanitizer
// report, create's verdict other than the files' (valid exactly when each is a non-empty whole
// number of records whose labels are in range), or a sample's label or pixels other than its
// record's.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "fuzz_dataset.hpp"
#include "fuzz_finding.hpp"
#include "fuzz_scratch.hpp"

namespace {

constexpr size_t kPlane = 32 * 32;

[[noreturn]] void finding(const std::string& what) { kiln::fuzz::finding("cifar_fuzz", what); }

const kiln::fuzz::Scratch& scratch() {
  static const kiln::fuzz::Scratch s("cifar_fuzz");
  return s;
}

struct File {
  explicit File(std::string n) : name(std::move(n)) {}
  std::string name;
  std::vector<uint8_t> bytes;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  scratch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const bool cifar100 = (mode & 1) != 0;
  const bool train = (mode & 2) == 0;
  const bool fine = (mode & 4) == 0;
  const bool cut = (mode & 8) != 0;
  const size_t label_bytes = cifar100 ? 2 : 1;
  const size_t label_at = cifar100 && fine ? 1 : 0;
  const int64_t num_classes = cifar100 ? (fine ? 100 : 20) : 10;
  const size_t record = label_bytes + 3 * kPlane;

  std::vector<File> files;
  if (cifar100) {
    files.emplace_back(train ? "train.bin" : "test.bin");
  } else if (train) {
    for (int k = 1; k <= 5; ++k) files.emplace_back("data_batch_" + std::to_string(k) + ".bin");
  } else {
    files.emplace_back("test_batch.bin");
  }
  size_t at = 1;
  std::vector<uint8_t> specs;
  for (size_t k = 0; k < files.size(); ++k) specs.push_back(at < size ? data[at++] : 1);

  scratch().clear();
  bool valid = true;
  for (size_t k = 0; k < files.size(); ++k) {
    File& f = files[k];
    const uint8_t spec = specs[k];
    const std::string path = scratch().path(f.name);
    if ((spec & 4) != 0) {
      valid = false;
      continue;
    }
    if ((spec & 8) != 0) {
      if (::mkdir(path.c_str(), 0700) != 0) finding("setup: mkdir failed");
      valid = false;
      continue;
    }
    size_t length = (spec & 3) * record;
    if ((spec & 16) != 0) ++length;
    if ((spec & 32) != 0 && length > 0) --length;
    for (size_t b = 0; b < length; ++b) f.bytes.push_back(at < size ? data[at++] : 0);
    scratch().write(f.name, f.bytes.data(), f.bytes.size());
    if (length == 0 || length % record != 0) valid = false;
    for (size_t r = 0; r < length / record; ++r) {
      if (f.bytes[r * record + label_at] >= num_classes) valid = false;
    }
  }

  kiln::fuzz::Options options;
  options.string("root", scratch().dir());
  if (cifar100) options.string("label", fine ? "fine" : "coarse");
  kiln::fuzz::Dataset dataset("cifar_fuzz", cifar100 ? kiln::datasets::kCifar100Component
                                                     : kiln::datasets::kCifar10Component);
  const int32_t code = dataset.create(options.get(), train ? KILN_SPLIT_TRAIN : KILN_SPLIT_VAL);
  if ((code == KILN_OK) != valid) {
    finding(valid ? "create refused valid files (status " + std::to_string(code) + ")"
                  : "create accepted invalid files");
  }
  if (code != KILN_OK) return 0;

  // Sample i is the records of the files in turn.
  struct Where {
    const File* file;
    size_t record;
  };
  std::vector<Where> samples;
  for (const File& f : files) {
    for (size_t r = 0; r < f.bytes.size() / record; ++r) samples.push_back({&f, r});
  }
  if (cut) {
    for (const File& f : files) {
      if (::truncate(scratch().path(f.name).c_str(), static_cast<off_t>(f.bytes.size() / 2)) != 0) {
        finding("setup: truncate failed");
      }
    }
  }

  const kiln_dataset_info info = dataset.info();
  if (info.num_samples != static_cast<int64_t>(samples.size()) || info.num_classes != num_classes ||
      info.channels != 3 || info.height != 32 || info.width != 32 ||
      info.target_kind != KILN_TARGET_CLASS) {
    finding("info disagrees with the files");
  }
  const auto n = static_cast<int64_t>(samples.size());
  for (const int64_t i : {int64_t{0}, n / 2, n - 1}) {
    const Where& w = samples[static_cast<size_t>(i)];
    const uint8_t* rec = w.file->bytes.data() + w.record * record;
    std::vector<uint8_t> pixels;
    std::vector<float> row;
    bool ok = false;
    if (dataset.sample(i, &pixels, &row, &ok) != rec[label_at]) {
      finding("sample " + std::to_string(i) + ": not its record's label");
    }
    if (!ok) {
      if (!cut) finding("decode of sample " + std::to_string(i) + " failed on unchanged files");
      continue;
    }
    for (size_t p = 0; p < kPlane; ++p) {  // the record's R, G and B planes, interleaved
      for (size_t c = 0; c < 3; ++c) {
        if (pixels[3 * p + c] != rec[label_bytes + c * kPlane + p]) {
          finding("sample " + std::to_string(i) + ": not its record's pixels");
        }
      }
    }
  }
  return 0;
}
