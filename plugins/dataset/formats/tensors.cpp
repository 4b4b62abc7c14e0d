// `tensors`: a safetensors file holding uint8 images (N x H x W x C or N x C x H x W, or N x H x W
// gray) and their labels (int64, int32 or uint8, N), or multi-label targets (N x C: uint8 or
// bool 0/1, float32 in [0, 1]). The header is checked by the host's own torch-free reader
// (io/safetensors_layout.cpp, fuzzed); the labels are read at create, each image at its offset
// when it is decoded.
#include <cstring>
#include <fstream>

#include "common.hpp"
#include "io/safetensors_layout.hpp"
#include "io/untrusted.hpp"

namespace kiln::datasets {
namespace {

class TensorsDataset final : public FixedDataset {
 public:
  std::unique_ptr<RandomAccessFile> file;
  std::string tensor;           // the images' name, for messages
  uint64_t first = 0;           // file offset of image 0
  bool nchw = false;            // the file's layout
  std::vector<int64_t> labels;  // one class per sample
  // Multi-label: N x C values, as the file holds them (one byte each for uint8 and bool).
  std::vector<uint8_t> target_bytes;
  std::vector<float> target_floats;

  int64_t label(int64_t index) const override {
    return multi_label ? 0 : labels[static_cast<size_t>(index)];
  }

  void targets(int64_t index, float* out) const override {
    // One label per sample: no rows to read (they are empty), so refuse as the base does.
    if (!multi_label) return FixedDataset::targets(index, out);
    const auto row = static_cast<size_t>(index * num_classes);
    for (size_t k = 0; k < static_cast<size_t>(num_classes); ++k) {
      out[k] = target_floats.empty() ? static_cast<float>(target_bytes[row + k])
                                     : target_floats[row + k];
    }
  }

  void pixels(int64_t index, uint8_t* out) const override {
    const auto bytes = static_cast<uint64_t>(height * width * channels);
    const std::string what = "tensor '" + tensor + "' sample " + std::to_string(index);
    if (!nchw || channels == 1) {
      file->read(first + static_cast<uint64_t>(index) * bytes, out, bytes, what);
      return;
    }
    std::vector<uint8_t> planes(bytes);
    file->read(first + static_cast<uint64_t>(index) * bytes, planes.data(), bytes, what);
    const int64_t plane = height * width;
    for (int64_t p = 0; p < plane; ++p) {
      for (int32_t c = 0; c < channels; ++c) out[p * channels + c] = planes[c * plane + p];
    }
  }
};

const io::SafetensorsEntry& find_tensor(const io::SafetensorsLayout& layout,
                                        const std::string& name, const std::string& path,
                                        const char* option) {
  for (const io::SafetensorsEntry& e : layout.entries) {
    if (e.name == name) return e;
  }
  std::string names;
  for (const io::SafetensorsEntry& e : layout.entries) {
    names += (names.empty() ? "" : ", ") + io::quote_name(e.name);
  }
  invalid("tensors: " + path + ": no tensor " + io::quote_name(name) + " (option '" + option +
          "'); the file holds " + (names.empty() ? std::string("none") : names));
}

// The labels tensor (I64, I32 or U8; one per image, [n]) as int64.
std::vector<int64_t> read_labels(RandomAccessFile& file, uint64_t data_start,
                                 const io::SafetensorsEntry& labels, const std::string& labels_name,
                                 int64_t n, const std::string& where) {
  size_t label_size = 0;
  if (labels.dtype == "I64") {
    label_size = 8;
  } else if (labels.dtype == "I32") {
    label_size = 4;
  } else if (labels.dtype == "U8") {
    label_size = 1;
  } else {
    invalid(where + "tensor " + io::quote_name(labels_name) + " is " + labels.dtype +
            "; labels are I64, I32 or U8");
  }
  if (labels.shape.size() != 1 || labels.shape[0] != n) {
    invalid(where + "tensor " + io::quote_name(labels_name) + " has shape " +
            io::shape_text(labels.shape) + "; one label per image, [" + std::to_string(n) + "]");
  }
  std::vector<uint8_t> raw(static_cast<size_t>(n) * label_size);
  file.read(data_start + labels.begin, raw.data(), raw.size(),
            "tensor " + io::quote_name(labels_name));
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (size_t i = 0; i < out.size(); ++i) {  // safetensors is little-endian
    const uint8_t* b = raw.data() + i * label_size;
    uint64_t u = 0;
    for (size_t k = 0; k < label_size; ++k) u |= uint64_t{b[k]} << (8 * k);
    int64_t v = 0;
    if (label_size == 8) {
      std::memcpy(&v, &u, sizeof v);
    } else if (label_size == 4) {
      v = static_cast<int32_t>(static_cast<uint32_t>(u));
    } else {
      v = static_cast<int64_t>(u);
    }
    out[i] = v;
  }
  return out;
}

// Multi-label targets (a 2-D labels tensor, [n, C]) into `d`: U8 or BOOL holding 0 or 1, or F32
// in [0, 1]; C must be `num_classes` unless that is 0. Returns C.
int64_t read_targets(RandomAccessFile& file, uint64_t data_start,
                     const io::SafetensorsEntry& labels, const std::string& labels_name, int64_t n,
                     int64_t num_classes, const std::string& where, TensorsDataset& d) {
  const std::string name = "tensor " + io::quote_name(labels_name);
  const int64_t c = labels.shape[1];
  if (labels.shape[0] != n || c <= 0) {
    invalid(where + name + " has shape " + io::shape_text(labels.shape) +
            "; multi-label targets are one row per image, [" + std::to_string(n) + ", classes]");
  }
  if (num_classes > 0 && c != num_classes) {
    invalid(where + name + " has " + std::to_string(c) +
            " classes per row; option "
            "'num_classes' says " +
            std::to_string(num_classes) + " (0 takes the row's)");
  }
  const auto count = static_cast<size_t>(n) * static_cast<size_t>(c);
  if (labels.dtype == "U8" || labels.dtype == "BOOL") {
    d.target_bytes.resize(count);
    file.read(data_start + labels.begin, d.target_bytes.data(), count, name);
    for (size_t i = 0; i < count; ++i) {
      if (d.target_bytes[i] > 1) {
        invalid(where + name + ": sample " + std::to_string(i / static_cast<size_t>(c)) +
                ", class " + std::to_string(i % static_cast<size_t>(c)) + " is " +
                std::to_string(d.target_bytes[i]) + "; uint8 targets are 0 or 1");
      }
    }
  } else if (labels.dtype == "F32") {
    // Straight into the floats: safetensors is little-endian, as x86 and Arm are.
    d.target_floats.resize(count);
    file.read(data_start + labels.begin, d.target_floats.data(), count * 4, name);
    for (size_t i = 0; i < count; ++i) {
      const float v = d.target_floats[i];
      if (!(v >= 0.0F && v <= 1.0F)) {
        invalid(where + name + ": sample " + std::to_string(i / static_cast<size_t>(c)) +
                ", class " + std::to_string(i % static_cast<size_t>(c)) + " is " +
                std::to_string(v) + "; float targets lie in [0, 1]");
      }
    }
  } else {
    invalid(where + name + " is " + labels.dtype +
            "; multi-label targets ([N, classes]) are U8, BOOL or F32");
  }
  d.multi_label = true;
  return c;
}

std::unique_ptr<FixedDataset> open_tensors(const kiln_options* options,
                                           const kiln_dataset_open& open) {
  const int32_t split = open.split;
  const char* file_option = split == KILN_SPLIT_TRAIN ? "train" : "val";
  const std::string path = string_option(options, file_option);
  if (path.empty()) {
    invalid(std::string("tensors: option '") + file_option + "' is empty: no " +
            (split == KILN_SPLIT_TRAIN ? "training" : "validation") + " file");
  }
  require_path("tensors", file_option, path);
  const std::string images_name = string_option(options, "images");
  const std::string labels_name = string_option(options, "labels");
  const bool nchw = string_option(options, "layout") == "nchw";
  const int64_t num_classes = int_option(options, "num_classes");

  auto d = std::make_unique<TensorsDataset>();
  d->file = std::make_unique<RandomAccessFile>(path);
  io::SafetensorsLayout layout;
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in)
      invalid("tensors: option '" + std::string(file_option) + "': " + path + ": cannot open");
    layout = io::read_safetensors_layout(in, d->file->size(), path);
  } catch (const io::BadFileError& e) {
    data_loss(std::string("tensors: ") + e.what());
  }
  const io::SafetensorsEntry& images = find_tensor(layout, images_name, path, "images");
  const io::SafetensorsEntry& labels = find_tensor(layout, labels_name, path, "labels");
  const std::string where = "tensors: " + path + ": ";
  if (images.dtype != "U8") {
    invalid(where + "tensor " + io::quote_name(images_name) + " is " + images.dtype +
            "; images are uint8 (U8)");
  }
  const std::vector<int64_t>& s = images.shape;
  if (s.size() != 3 && s.size() != 4) {
    invalid(where + "tensor " + io::quote_name(images_name) + " has shape " + io::shape_text(s) +
            "; images are N x H x W (gray), N x H x W x C (layout \"nhwc\") or N x C x H x W "
            "(\"nchw\")");
  }
  const bool gray = s.size() == 3;
  const int64_t n = s[0];
  const int64_t c = gray ? 1 : (nchw ? s[1] : s[3]);
  const int64_t h = gray ? s[1] : (nchw ? s[2] : s[1]);
  const int64_t w = gray ? s[2] : (nchw ? s[3] : s[2]);
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0 || c > 0x7fffffff) {
    invalid(where + "tensor " + io::quote_name(images_name) + " has shape " + io::shape_text(s) +
            (gray   ? ""
             : nchw ? " (read as N x C x H x W)"
                    : " (read as N x H x W x C)") +
            "; every dimension must be > 0");
  }
  if (labels.shape.size() == 2) {
    d->num_classes =
        read_targets(*d->file, layout.data_start, labels, labels_name, n, num_classes, where, *d);
  } else {
    d->labels = read_labels(*d->file, layout.data_start, labels, labels_name, n, where);
    d->num_classes = check_labels(d->labels, num_classes, path, "tensors");
  }
  d->tensor = images_name;
  d->first = layout.data_start + images.begin;
  d->nchw = nchw;
  d->num_samples = n;
  d->channels = static_cast<int32_t>(c);
  d->height = h;
  d->width = w;
  return d;
}

const kiln_option_spec kTensorsOptions[] = {
    KILN_OPTION_INIT("train", KILN_OPT_STRING, nullptr, "safetensors file of the training split"),
    KILN_OPTION_INIT("val", KILN_OPT_STRING, "\"\"",
                     "safetensors file of the validation split (\"\": none)"),
    KILN_OPTION_INIT("images", KILN_OPT_STRING, "\"images\"", "the images' tensor (uint8)"),
    KILN_OPTION_INIT("labels", KILN_OPT_STRING, "\"labels\"",
                     "the labels' tensor: int64, int32 or uint8 [N] (one class per image), or "
                     "multi-label targets [N, classes] (uint8 or bool 0/1, float32 in [0, 1])"),
    KILN_OPTION_CHOICES_INIT("layout", "nhwc,nchw", "\"nhwc\"",
                             "4-D images: N x H x W x C or N x C x H x W (3-D: gray)"),
    KILN_OPTION_MIN_INIT("num_classes", KILN_OPT_INT, 0.0, "0",
                         "classes; 0 takes the largest label + 1 (multi-label: the row's width)")};

const kiln_dataset_vtable kTensorsVtable = make_vtable<open_tensors>();

}  // namespace

const kiln_component_descriptor kTensorsComponent =
    KILN_COMPONENT_OPTIONS_INIT(KILN_COMPONENT_DATASET, "tensors", KILN_VERSION_INIT(1, 0, 0),
                                "uint8 images and their labels (or multi-label targets) in a "
                                "safetensors file",
                                &kCapabilities, kTensorsOptions, &kTensorsVtable);

}  // namespace kiln::datasets
