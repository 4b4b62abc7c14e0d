// What the built-in datasets share: every one holds samples of one size (IDX, CIFAR, tensors,
// synthetic), so a component is a FixedDataset subclass and a factory; the C vtable around it
// (the exception guard, the capacity and index checks, the struct filling) is written once here.
// Plain C++: no LibTorch, no host code beyond the torch-free file readers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dataset.h"
#include "kiln/sdk.hpp"

namespace kiln::datasets {

// A dataset whose samples share one size; decode needs no scaling (the formats store pixels).
class FixedDataset {
 public:
  virtual ~FixedDataset() = default;
  int64_t num_samples = 0;
  int64_t num_classes = 0;
  int32_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  // Multi-label (KILN_TARGET_MULTI_LABEL): targets() gives each sample's row, label() 0.
  bool multi_label = false;
  // Sample `index`'s label, in [0, num_classes) (checked when the dataset was opened).
  virtual int64_t label(int64_t index) const = 0;
  // Multi-label only: sample `index`'s num_classes values in [0, 1] (checked when opened).
  virtual void targets(int64_t index, float* out) const;
  // Writes sample `index` as height x width x channels bytes (HWC) to `out`. Throws
  // kiln::Error(KILN_ERR_DATA_LOSS) naming the file and record when it cannot be read.
  virtual void pixels(int64_t index, uint8_t* out) const = 0;
};

// Opens `open.split` (KILN_SPLIT_*) as `options` say; throws kiln::Error.
using Factory = std::unique_ptr<FixedDataset> (*)(const kiln_options* options,
                                                  const kiln_dataset_open& open);

// Errors the factories throw: a bad option or a missing path (the host reports it as a
// configuration error), and unreadable data.
[[noreturn]] void invalid(const std::string& message);
[[noreturn]] void data_loss(const std::string& message);

// Options, typed as the schema declares them (the host validated and filled them).
std::string string_option(const kiln_options* options, const char* name);
int64_t int_option(const kiln_options* options, const char* name);

// `root`/`name` (or `name` when it is absolute, or root is empty).
std::string join_path(const std::string& root, const std::string& name);
// Throws invalid("<component>: option '<option>': <path>: <why>") unless `path` is a readable
// regular file (or a folder, when `folder`).
void require_path(const char* component, const char* option, const std::string& path,
                  bool folder = false);

// A file read at any offset from many threads at once (pread), closed with the object.
class RandomAccessFile {
 public:
  explicit RandomAccessFile(const std::string& path);  // throws invalid() when it cannot open
  ~RandomAccessFile();
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads exactly `length` bytes at `offset`; throws data_loss("<path>: <what>: ...") when the
  // file has fewer (it changed since it was opened) or the read fails.
  void read(uint64_t offset, void* out, uint64_t length, const std::string& what) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Checks every label against `num_classes` (0: the class count is taken as the largest label
// + 1) and returns the class count. A label outside the range throws invalid() naming the file,
// the sample and the option.
int64_t check_labels(const std::vector<int64_t>& labels, int64_t num_classes,
                     const std::string& file, const char* component);

// The slots every dataset shares (the instance carries the host for its statuses), and create,
// one per factory.
void destroy_slot(void* instance);
kiln_status* info_slot(void* instance, kiln_dataset_info* out);
kiln_status* probe_slot(void* instance, int64_t index, kiln_sample_header* out);
kiln_status* decode_slot(void* instance, int64_t index, const kiln_decode_request* request,
                         kiln_decoded_sample* out);
kiln_status* targets_slot(void* instance, int64_t index, float* out, int64_t count);
kiln_status* create_with(Factory factory, const kiln_host_api* host, const kiln_options* options,
                         const kiln_dataset_open* open, void** out);

template <Factory F>
kiln_status* create_slot(const kiln_host_api* host, const kiln_options* options,
                         const kiln_dataset_open* open, void** out) {
  return create_with(F, host, options, open, out);
}

// The vtable of the component whose instances `F` makes.
template <Factory F>
constexpr kiln_dataset_vtable make_vtable() {
  return KILN_DATASET_VTABLE_TARGETS_INIT(create_slot<F>, destroy_slot, info_slot, probe_slot,
                                          decode_slot, targets_slot);
}

// Capabilities of every built-in dataset: host memory only, no tensors cross.
extern const kiln_capabilities kCapabilities;

// The components (one file each).
extern const kiln_component_descriptor kIdxComponent;
extern const kiln_component_descriptor kFashionMnistComponent;
extern const kiln_component_descriptor kCifar10Component;
extern const kiln_component_descriptor kCifar100Component;
extern const kiln_component_descriptor kTensorsComponent;
extern const kiln_component_descriptor kSyntheticComponent;

}  // namespace kiln::datasets
