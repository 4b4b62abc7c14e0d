// `cifar10` and `cifar100`: the binary versions. Records of label byte(s) then 3072 bytes of R, G
// and B planes of 32 x 32, 10,000 to a CIFAR-10 file (data_batch_1..5.bin, test_batch.bin; one
// label byte), CIFAR-100 in train.bin and test.bin (two: coarse, fine). The labels are read at
// create; the pixels of a record when it is decoded, at its offset, from any thread.
#include "common.hpp"

namespace kiln::datasets {
namespace {

constexpr int64_t kSide = 32;
constexpr int64_t kPixels = 3 * kSide * kSide;

class CifarDataset final : public FixedDataset {
 public:
  std::vector<std::unique_ptr<RandomAccessFile>> files;
  int64_t label_bytes = 1;
  // Sample i: file, record within it, label.
  std::vector<uint32_t> file_of;
  std::vector<int64_t> record_of;
  std::vector<int64_t> labels;

  int64_t label(int64_t index) const override { return labels[static_cast<size_t>(index)]; }

  void pixels(int64_t index, uint8_t* out) const override {
    const auto i = static_cast<size_t>(index);
    const RandomAccessFile& file = *files[file_of[i]];
    const int64_t record = record_of[i];
    uint8_t planes[kPixels];
    file.read(static_cast<uint64_t>(record * (label_bytes + kPixels) + label_bytes), planes,
              kPixels, "record " + std::to_string(record));
    for (int64_t p = 0; p < kSide * kSide; ++p) {  // R, G, B planes -> HWC
      out[3 * p] = planes[p];
      out[3 * p + 1] = planes[kSide * kSide + p];
      out[3 * p + 2] = planes[2 * kSide * kSide + p];
    }
  }
};

// Opens `names` under the root; `label_at` is the label byte used (CIFAR-100: 0 coarse, 1 fine).
std::unique_ptr<FixedDataset> open_cifar(const char* component, const kiln_options* options,
                                         const std::vector<std::string>& names, int64_t label_bytes,
                                         int64_t label_at, int64_t num_classes) {
  const std::string root = string_option(options, "root");
  require_path(component, "root", root, /*folder=*/true);
  auto d = std::make_unique<CifarDataset>();
  d->label_bytes = label_bytes;
  const int64_t record_size = label_bytes + kPixels;
  for (const std::string& name : names) {
    const std::string path = join_path(root, name);
    require_path(component, "root", path);
    auto file = std::make_unique<RandomAccessFile>(path);
    if (file->size() == 0 || file->size() % static_cast<uint64_t>(record_size) != 0) {
      data_loss(std::string(component) + ": " + path + ": " + std::to_string(file->size()) +
                " bytes is not a whole number of " + std::to_string(record_size) +
                "-byte records (truncated, or not the binary version?)");
    }
    const int64_t records = static_cast<int64_t>(file->size()) / record_size;
    // The labels: read in blocks of records, not one read per record.
    constexpr int64_t kBlock = 256;
    std::vector<uint8_t> block(static_cast<size_t>(kBlock * record_size));
    for (int64_t first = 0; first < records; first += kBlock) {
      const int64_t count = std::min(kBlock, records - first);
      file->read(static_cast<uint64_t>(first * record_size), block.data(),
                 static_cast<uint64_t>(count * record_size),
                 "records " + std::to_string(first) + ".." + std::to_string(first + count - 1));
      for (int64_t r = 0; r < count; ++r) {
        const int64_t label = block[static_cast<size_t>(r * record_size + label_at)];
        if (label >= num_classes) {
          data_loss(std::string(component) + ": " + path + ": record " + std::to_string(first + r) +
                    ": label " + std::to_string(label) + " is outside [0, " +
                    std::to_string(num_classes) + ")");
        }
        d->file_of.push_back(static_cast<uint32_t>(d->files.size()));
        d->record_of.push_back(first + r);
        d->labels.push_back(label);
      }
    }
    d->files.push_back(std::move(file));
  }
  d->num_samples = static_cast<int64_t>(d->labels.size());
  d->num_classes = num_classes;
  d->channels = 3;
  d->height = d->width = kSide;
  return d;
}

std::unique_ptr<FixedDataset> open_cifar10(const kiln_options* options,
                                           const kiln_dataset_open& open) {
  const int32_t split = open.split;
  std::vector<std::string> names;
  if (split == KILN_SPLIT_TRAIN) {
    for (int k = 1; k <= 5; ++k) names.push_back("data_batch_" + std::to_string(k) + ".bin");
  } else {
    names.emplace_back("test_batch.bin");
  }
  return open_cifar("cifar10", options, names, 1, 0, 10);
}

std::unique_ptr<FixedDataset> open_cifar100(const kiln_options* options,
                                            const kiln_dataset_open& open) {
  const int32_t split = open.split;
  const std::string which = string_option(options, "label");
  if (which != "fine" && which != "coarse") {
    invalid("cifar100: option 'label' is \"" + which + "\"; \"fine\" or \"coarse\"");
  }
  const bool fine = which == "fine";
  return open_cifar("cifar100", options, {split == KILN_SPLIT_TRAIN ? "train.bin" : "test.bin"}, 2,
                    fine ? 1 : 0, fine ? 100 : 20);
}

const kiln_option_spec kCifar10Options[] = {KILN_OPTION_INIT(
    "root", KILN_OPT_STRING, nullptr,
    "folder holding data_batch_1..5.bin and test_batch.bin (cifar-10-batches-bin)")};

const kiln_option_spec kCifar100Options[] = {
    KILN_OPTION_INIT("root", KILN_OPT_STRING, nullptr,
                     "folder holding train.bin and test.bin (cifar-100-binary)"),
    KILN_OPTION_CHOICES_INIT("label", "fine,coarse", "\"fine\"",
                             "which label: the 100 fine classes or the 20 coarse ones")};

const kiln_dataset_vtable kCifar10Vtable = make_vtable<open_cifar10>();
const kiln_dataset_vtable kCifar100Vtable = make_vtable<open_cifar100>();

}  // namespace

const kiln_component_descriptor kCifar10Component =
    KILN_COMPONENT_OPTIONS_INIT(KILN_COMPONENT_DATASET, "cifar10", KILN_VERSION_INIT(1, 0, 0),
                                "CIFAR-10, binary version (32 x 32 RGB, 10 classes)",
                                &kCapabilities, kCifar10Options, &kCifar10Vtable);

const kiln_component_descriptor kCifar100Component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_DATASET, "cifar100", KILN_VERSION_INIT(1, 0, 0),
    "CIFAR-100, binary version (32 x 32 RGB, 100 fine or 20 coarse classes)", &kCapabilities,
    kCifar100Options, &kCifar100Vtable);

}  // namespace kiln::datasets
