// libFuzzer target: arbitrary bytes as the safetensors file of a tensors dataset through the
// component's slots (plugins/dataset/formats/tensors.cpp, as the host's adapter calls them):
// create, info, then probe, decode and targets of the first, a middle and the last sample.
//
// Input: a mode byte, then the file. Mode bit 0: layout "nchw" (else "nhwc"); bit 1: the val
// split (the file given as option 'val'); bits 2-3: num_classes 0 (from the labels), 1, 10, 256.
//
// Refusals (INVALID_ARGUMENT, DATA_LOSS) are the expected answers to bad files. Anything else
// aborts, and so is a finding: another status (an exception other than kiln::Error), a sanitizer
// report, a file whose header the safetensors reader refuses accepted, or an accepted file whose
// info, labels, target rows or pixels are not what its tensors hold (read here from the layout).
#include <cstdint>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "common.hpp"
#include "fuzz_dataset.hpp"
#include "fuzz_finding.hpp"
#include "fuzz_scratch.hpp"
#include "io/safetensors_layout.hpp"
#include "io/untrusted.hpp"

namespace {

using kiln::io::SafetensorsEntry;

[[noreturn]] void finding(const std::string& what) { kiln::fuzz::finding("tensors_fuzz", what); }

const kiln::fuzz::Scratch& scratch() {
  static const kiln::fuzz::Scratch s("tensors_fuzz");
  return s;
}

const SafetensorsEntry& entry(const kiln::io::SafetensorsLayout& layout, const char* name) {
  for (const SafetensorsEntry& e : layout.entries) {
    if (e.name == name) return e;
  }
  finding(std::string("accepted a file without tensor '") + name + "'");
}

// Element `k` of `e` (little-endian) as the dataset reads it: labels as integers, targets as
// floats.
double element(const uint8_t* bytes, const SafetensorsEntry& e, size_t k) {
  const size_t width = kiln::io::safetensors_element_size(e.dtype);
  const uint8_t* p = bytes + e.begin + k * width;
  uint64_t u = 0;
  for (size_t b = 0; b < width; ++b) u |= uint64_t{p[b]} << (8 * b);
  if (e.dtype == "F32") {
    float f = 0;
    const auto bits = static_cast<uint32_t>(u);
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  if (e.dtype == "I64") {
    int64_t v = 0;
    std::memcpy(&v, &u, sizeof v);
    return static_cast<double>(v);
  }
  if (e.dtype == "I32") return static_cast<int32_t>(static_cast<uint32_t>(u));
  return static_cast<double>(u);  // U8, BOOL
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  scratch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const bool nchw = (mode & 1) != 0;
  const bool train = (mode & 2) == 0;
  static constexpr int64_t kClasses[] = {0, 1, 10, 256};
  const int64_t num_classes = kClasses[(mode >> 2) & 3];
  const uint8_t* file = data + 1;
  const size_t file_size = size - 1;
  const std::string path = scratch().write("data.safetensors", file, file_size);

  kiln::fuzz::Options options;
  options.string("train", path);
  options.string("val", train ? "" : path);
  options.string("images", "images");
  options.string("labels", "labels");
  options.string("layout", nchw ? "nchw" : "nhwc");
  options.integer("num_classes", num_classes);
  kiln::fuzz::Dataset dataset("tensors_fuzz", kiln::datasets::kTensorsComponent);
  const int32_t code = dataset.create(options.get(), train ? KILN_SPLIT_TRAIN : KILN_SPLIT_VAL);

  // The layout by the fuzzed reader of its own (safetensors_fuzz): what the dataset must hold.
  kiln::io::SafetensorsLayout layout;
  try {
    std::istringstream in(std::string(reinterpret_cast<const char*>(file), file_size));
    layout = kiln::io::read_safetensors_layout(in, file_size, path);
  } catch (const kiln::io::BadFileError&) {
    if (code == KILN_OK) finding("create accepted a file the safetensors reader refuses");
    return 0;
  } catch (const std::exception& e) {
    finding(std::string("read_safetensors_layout threw: ") + e.what());
  }
  if (code != KILN_OK) return 0;

  const SafetensorsEntry& images = entry(layout, "images");
  const SafetensorsEntry& labels = entry(layout, "labels");
  const std::vector<int64_t>& s = images.shape;
  if (images.dtype != "U8" || (s.size() != 3 && s.size() != 4)) finding("accepted the images");
  const bool gray = s.size() == 3;
  const int64_t n = s[0];
  const int64_t c = gray ? 1 : (nchw ? s[1] : s[3]);
  const int64_t h = gray ? s[1] : (nchw ? s[2] : s[1]);
  const int64_t w = gray ? s[2] : (nchw ? s[3] : s[2]);
  const bool multi = labels.shape.size() == 2;
  const kiln_dataset_info info = dataset.info();
  if (info.num_samples != n || info.channels != c || info.height != h || info.width != w ||
      info.target_kind != (multi ? KILN_TARGET_MULTI_LABEL : KILN_TARGET_CLASS) ||
      (num_classes > 0 && info.num_classes != num_classes) ||
      (multi && info.num_classes != labels.shape[1])) {
    finding("info disagrees with the file's tensors");
  }

  const uint8_t* tensors = file + layout.data_start;
  const auto sample_bytes = static_cast<size_t>(h * w * c);
  for (const int64_t i : {int64_t{0}, n / 2, n - 1}) {
    std::vector<uint8_t> pixels;
    std::vector<float> row;
    bool ok = false;
    const int64_t label = dataset.sample(i, &pixels, &row, &ok);
    const auto k = static_cast<size_t>(i);
    if (!ok) finding("decode of sample " + std::to_string(i) + " failed on an unchanged file");
    if (multi) {
      if (label != 0) finding("a multi-label sample's label is not 0");
      for (size_t j = 0; j < row.size(); ++j) {
        if (row[j] != static_cast<float>(element(tensors, labels, k * row.size() + j))) {
          finding("sample " + std::to_string(i) + ": not its target row");
        }
      }
    } else if (static_cast<double>(label) != element(tensors, labels, k)) {
      finding("sample " + std::to_string(i) + ": not its label");
    }
    const uint8_t* stored = tensors + images.begin + k * sample_bytes;
    const auto plane = static_cast<size_t>(h * w);
    const auto channels = static_cast<size_t>(c);
    for (size_t p = 0; p < plane; ++p) {
      for (size_t ch = 0; ch < channels; ++ch) {
        const uint8_t want = nchw ? stored[ch * plane + p] : stored[p * channels + ch];
        if (pixels[p * channels + ch] != want) {
          finding("sample " + std::to_string(i) + ": not its pixels");
        }
      }
    }
  }
  return 0;
}
