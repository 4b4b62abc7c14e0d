// Calling the image_folder dataset through its vtable (libkiln_image_folder.so opened with
// dlopen, the torch-free status-only host), and the oracle's folders: tests/oracle/
// image_folder.py writes them once per test process with what torchvision's ImageFolder and PIL
// make of them (manifest.json and raw pixel files).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "host_base.hpp"
#include "kiln/dataset.h"
#include "options.hpp"

namespace kiln::dataset_test {

using kiln::test::describe;
using kiln::test::Options;
using kiln::test::Status;

// The oracle's output, made on first use and kept for the process.
struct Oracle {
  std::string dir;
  nlohmann::json manifest;
  // The tree's folder `rel` (tree/<rel>).
  std::string tree(const std::string& rel) const { return dir + "/tree/" + rel; }
  // The raw bytes the oracle wrote to pixels/`name`.
  std::vector<uint8_t> pixels(const std::string& name) const;
};
const Oracle& oracle();

// The image_folder options with every key set (as the host fills the defaults).
struct Config {
  std::string root;
  std::string val_root;
  std::string color = "rgb";
  std::vector<std::string> extensions = {".jpg", ".jpeg", ".png"};
  uint64_t max_pixels = 89478485;  // kiln_dataset_open.max_pixels: data.max_image_pixels
};

struct Sample {
  int64_t height = 0, width = 0, label = -1;
  int32_t scale = 0;
  std::vector<uint8_t> pixels;
};

// One instance; create() returns the plugin's refusal (nullptr on success).
class Dataset {
 public:
  Dataset() = default;
  ~Dataset();
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  Status create(const Config& config, int32_t split = KILN_SPLIT_TRAIN);
  kiln_dataset_info info() const;  // records a failure when refused
  Status probe(int64_t index, kiln_sample_header* out) const;
  // Decodes into a buffer of `capacity` bytes (the full-scale size when 0).
  Status decode(int64_t index, int32_t scale_denom, Sample* out, size_t capacity = 0) const;
  void* instance() const { return instance_; }

 private:
  void* instance_ = nullptr;
};

// The message of a refusal expected with `code`, "" (and a test failure) otherwise.
std::string refusal(const Status& status, int32_t code);

const kiln_dataset_vtable& vtable();
const kiln_component_descriptor& component();
const kiln_plugin_descriptor& library();
uint32_t library_probe();

}  // namespace kiln::dataset_test
