// `idx` and `fashion-mnist`: the MNIST family's IDX files (gzip or plain), read whole at create
// (they are small, and a gzip stream cannot be read at an offset). Images N x H x W (gray) or
// N x C x H x W (any channel count), labels N bytes.
#include "data/idx.hpp"

#include <cstring>

#include "common.hpp"
#include "io/untrusted.hpp"

namespace kiln::datasets {
namespace {

class IdxDataset final : public FixedDataset {
 public:
  std::vector<uint8_t> images;  // N x C x H x W, as the file stores them
  std::vector<int64_t> labels;

  int64_t label(int64_t index) const override { return labels[static_cast<size_t>(index)]; }

  void pixels(int64_t index, uint8_t* out) const override {
    const int64_t plane = height * width;
    const uint8_t* src = images.data() + index * plane * channels;
    if (channels == 1) {
      std::memcpy(out, src, static_cast<size_t>(plane));
      return;
    }
    for (int64_t p = 0; p < plane; ++p) {  // CHW -> HWC
      for (int32_t c = 0; c < channels; ++c) out[p * channels + c] = src[c * plane + p];
    }
  }
};

template <const char* Name>
std::unique_ptr<FixedDataset> open_idx(const kiln_options* options, const kiln_dataset_open& open) {
  const int32_t split = open.split;
  const std::string root = string_option(options, "root");
  require_path(Name, "root", root, /*folder=*/true);
  const bool train = split == KILN_SPLIT_TRAIN;
  const char* images_option = train ? "train_images" : "val_images";
  const char* labels_option = train ? "train_labels" : "val_labels";
  const std::string images_path = join_path(root, string_option(options, images_option));
  const std::string labels_path = join_path(root, string_option(options, labels_option));
  require_path(Name, images_option, images_path);
  require_path(Name, labels_option, labels_path);
  const int64_t num_classes = int_option(options, "num_classes");
  if (num_classes < 0) invalid(std::string(Name) + ": option 'num_classes' is negative");

  // A gzip stream inflates far past its file: an image's size is held to the pixel limit
  // (kiln_pixel_limit) from the header, before its data is read.
  const uint64_t max_pixels =
      KILN_HAS_FIELD(&open, kiln_dataset_open, max_pixels) ? open.max_pixels : 0;
  const auto check_dims = [&](const std::vector<uint64_t>& dims) {
    const uint64_t h = dims[dims.size() - 2], w = dims.back();
    if (kiln_pixel_limit(h, w, max_pixels) == KILN_PIXELS_REFUSE) {
      invalid(std::string(Name) + ": " + images_path + ": images of " + std::to_string(h) + "x" +
              std::to_string(w) + " pixels, more than twice data.max_image_pixels (" +
              std::to_string(max_pixels) + ")");
    }
  };
  auto d = std::make_unique<IdxDataset>();
  try {
    data::IdxBytes images =
        data::read_idx_ubyte(images_path, 3, 4, "image", "pixel data", check_dims);
    const bool gray = images.dims.size() == 3;
    const uint64_t n = images.dims[0];
    const uint64_t c = gray ? 1 : images.dims[1];
    const uint64_t h = images.dims[gray ? 1 : 2], w = images.dims[gray ? 2 : 3];
    if (n == 0 || c == 0 || h == 0 || w == 0 || c > 0x7fffffff) {
      data_loss(images_path + ": image dimensions " + io::shape_text(images.dims) +
                ": every one must be > 0");
    }
    data::IdxBytes raw = data::read_idx_ubyte(labels_path, 1, "label", "label data");
    if (raw.data.size() != n) {
      data_loss(images_path + ": " + std::to_string(n) + " images but " + labels_path + " has " +
                std::to_string(raw.data.size()) + " labels");
    }
    d->images = std::move(images.data);
    d->labels.assign(raw.data.begin(), raw.data.end());
    d->num_samples = static_cast<int64_t>(n);
    d->channels = static_cast<int32_t>(c);
    d->height = static_cast<int64_t>(h);
    d->width = static_cast<int64_t>(w);
  } catch (const io::BadFileError& e) {
    data_loss(std::string(Name) + ": " + e.what());
  }
  d->num_classes = check_labels(d->labels, num_classes, labels_path, Name);
  return d;
}

constexpr char kIdx[] = "idx";
constexpr char kFashion[] = "fashion-mnist";

#define KILN_IDX_FILE_OPTIONS                                                             \
  KILN_OPTION_INIT("train_images", KILN_OPT_STRING, "\"train-images-idx3-ubyte.gz\"",     \
                   "training images under root (IDX, gzip or plain)"),                    \
      KILN_OPTION_INIT("train_labels", KILN_OPT_STRING, "\"train-labels-idx1-ubyte.gz\"", \
                       "training labels under root"),                                     \
      KILN_OPTION_INIT("val_images", KILN_OPT_STRING, "\"t10k-images-idx3-ubyte.gz\"",    \
                       "validation images under root"),                                   \
      KILN_OPTION_INIT("val_labels", KILN_OPT_STRING, "\"t10k-labels-idx1-ubyte.gz\"",    \
                       "validation labels under root")

const kiln_option_spec kIdxOptions[] = {
    KILN_OPTION_INIT("root", KILN_OPT_STRING, nullptr, "folder holding the IDX files"),
    KILN_IDX_FILE_OPTIONS,
    KILN_OPTION_MIN_INIT("num_classes", KILN_OPT_INT, 0.0, "0",
                         "classes; 0 takes the largest label + 1")};

const kiln_option_spec kFashionOptions[] = {
    KILN_OPTION_INIT("root", KILN_OPT_STRING, "\"/usr/share/datasets/fashion-mnist\"",
                     "folder holding Fashion-MNIST's IDX files"),
    KILN_IDX_FILE_OPTIONS,
    KILN_OPTION_MIN_INIT("num_classes", KILN_OPT_INT, 0.0, "10",
                         "classes; 0 takes the largest label + 1")};

const kiln_dataset_vtable kIdxVtable = make_vtable<open_idx<kIdx>>();
const kiln_dataset_vtable kFashionVtable = make_vtable<open_idx<kFashion>>();

}  // namespace

const kiln_component_descriptor kIdxComponent =
    KILN_COMPONENT_OPTIONS_INIT(KILN_COMPONENT_DATASET, kIdx, KILN_VERSION_INIT(1, 0, 0),
                                "IDX image and label files (MNIST family), gray or N x C x H x W",
                                &kCapabilities, kIdxOptions, &kIdxVtable);

const kiln_component_descriptor kFashionMnistComponent =
    KILN_COMPONENT_OPTIONS_INIT(KILN_COMPONENT_DATASET, kFashion, KILN_VERSION_INIT(1, 0, 0),
                                "Fashion-MNIST (the idx dataset with its root and 10 classes)",
                                &kCapabilities, kFashionOptions, &kFashionVtable);

}  // namespace kiln::datasets
