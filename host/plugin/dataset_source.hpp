// The dataset adapter: a dataset component's C vtable (kiln/dataset.h) as a data::Source the
// loader reads from its worker threads. It lives with the other adapters (host/plugin) because
// host/data does not depend on the plugin machinery; the loader only sees data::Source.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "config/options.hpp"
#include "data/source.hpp"
#include "kiln/dataset.h"
#include "plugin/registry.hpp"

namespace kiln::plugin {

class DatasetSource final : public data::Source {
 public:
  // Opens `split` (KILN_SPLIT_*) of `component` (a KILN_COMPONENT_DATASET) with its validated
  // options; `seed` is the run's (kiln_dataset_open.seed), `max_pixels` data.max_image_pixels
  // (0: no limit). A refusal of create is an OptionsRefused (section "data"): a configuration
  // error naming the option and path; so is a fixed sample size over the pixel limit (at
  // data.max_image_pixels). An info that breaks the contract (no samples, no classes, no
  // channels, a size whose bytes overflow, a non-zero reserved field, an unknown target kind,
  // multi-label without the targets slot) is a data::BrokenSource naming the plugin.
  DatasetSource(const Component& component, const config::OptionSet& options, int32_t split,
                uint64_t seed = 0, uint64_t max_pixels = data::kDefaultMaxImagePixels);
  ~DatasetSource() override;
  DatasetSource(const DatasetSource&) = delete;
  DatasetSource& operator=(const DatasetSource&) = delete;

  int64_t size() const override { return size_; }
  int64_t num_classes() const override { return num_classes_; }
  int64_t channels() const override { return channels_; }
  int64_t fixed_height() const override { return height_; }
  int64_t fixed_width() const override { return width_; }
  std::vector<std::string> class_names() const override { return class_names_; }
  // Thread-safe, as the plugin's slots are. A status of KILN_ERR_DATA_LOSS becomes a
  // data::SampleError carrying the plugin's message (which names the file and record); decode's
  // KILN_ERR_INVALID_ARGUMENT a std::invalid_argument; any other a ComponentError naming the
  // component. An index outside [0, size()) is a std::out_of_range, before the plugin is called.
  // A size the pixel limit refuses (kiln_pixel_limit) is a SampleError naming the sample, as
  // the plugin's own refusal would be; one above the limit is decoded with a warning (once per
  // sample). What breaks the contract (a size <= 0, a label out of range, more written than the
  // buffer holds, a fixed-size dataset decoding another size) is a data::BrokenSource.
  data::SampleHeader probe(int64_t index) const override;
  data::DecodedSample decode(int64_t index, int scale_denom, uint8_t* pixels,
                             size_t capacity) const override;
  bool multi_label() const override { return multi_label_; }
  // As decode; a value outside [0, 1] (or NaN) is a data::BrokenSource naming the sample.
  void targets(int64_t index, float* out) const override;
  // "sample 8 (<what the plugin's sample_name slot writes>)", or "sample 8" without the slot
  // (ABI 1.13) or when it fails.
  std::string sample_name(int64_t index) const override;
  std::string provider() const override;

  const std::string& name() const { return name_; }

 private:
  std::string where(const char* entry) const;  // "dataset '<name>' <entry> (<library>)"
  [[noreturn]] void fail(kiln_status* status, const char* entry, int64_t index) const;
  void check_index(int64_t index) const;
  // Holds a sample's size, as `entry` reported it, to the pixel limit: throws SampleError
  // when refused, warns once for the sample when above the limit.
  void check_pixels(int64_t index, int64_t height, int64_t width, const char* entry) const;

  std::string name_;
  std::string library_;
  const kiln_dataset_vtable* vtable_;
  void* instance_ = nullptr;
  int64_t size_ = 0, num_classes_ = 0, channels_ = 0, height_ = 0, width_ = 0;
  uint64_t max_pixels_ = 0;
  std::vector<std::string> class_names_;
  bool multi_label_ = false;
  mutable std::mutex warned_mutex_;
  mutable std::set<int64_t> warned_;  // samples above the pixel limit already warned about
};

// The dataset component `name` of `registry`, opened for `split`. Throws std::invalid_argument
// naming the datasets there are when none is called `name`.
std::unique_ptr<DatasetSource> make_dataset_source(
    const Registry& registry, const std::string& name, const config::OptionSet& options,
    int32_t split, uint64_t seed = 0, uint64_t max_pixels = data::kDefaultMaxImagePixels);

// The component's options at their schema defaults (required ones, which have none, absent):
// a start for callers that set a few options without a pipeline file (tests, tools).
config::OptionSet default_options(const Component& component);

}  // namespace kiln::plugin
