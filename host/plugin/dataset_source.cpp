#include "plugin/dataset_source.hpp"

#include <spdlog/spdlog.h>

#include <cstdint>
#include <stdexcept>

#include "config/value_check.hpp"
#include "plugin/host_api.hpp"
#include "plugin/plugin_call.hpp"
#include "plugin/status.hpp"

namespace kiln::plugin {
namespace {

std::string contract(const std::string& who, const std::string& what) {
  return who + " broke the dataset contract: " + what;
}

[[noreturn]] void broken(const std::string& who, const std::string& what) {
  throw data::BrokenSource(contract(who, what));
}

std::string size_text(int64_t height, int64_t width) {
  return std::to_string(height) + "x" + std::to_string(width);
}

// Whether height x width x channels bytes (all > 0) can be counted in an int64_t.
bool countable(uint64_t height, uint64_t width, uint64_t channels) {
  return kiln_pixel_limit(height, width, 0) != KILN_PIXELS_REFUSE &&
         height * width <= static_cast<uint64_t>(INT64_MAX) / channels;
}

// What `info` reported, against the contract of kiln/dataset.h; `who` names the plugin.
void check_info(const kiln_dataset_info& info, const std::string& who) {
  if (info.num_samples <= 0) {
    broken(who, "info reports " + std::to_string(info.num_samples) +
                    " samples; a split holds at least one");
  }
  if (info.num_classes <= 0) {
    broken(who, "info reports " + std::to_string(info.num_classes) + " classes; at least one");
  }
  if (info.channels <= 0) {
    broken(who, "info reports " + std::to_string(info.channels) + " channels; at least one");
  }
  if (info.reserved != 0) {
    broken(who,
           "kiln_dataset_info field 'reserved' is " + std::to_string(info.reserved) + ", not zero");
  }
  if (info.height < 0 || info.width < 0 || (info.height == 0) != (info.width == 0)) {
    broken(who, "info reports a sample size of " + size_text(info.height, info.width) +
                    "; both positive, or both 0 when sizes differ");
  }
  // A sample's bytes must be countable before anything multiplies them.
  if (info.height > 0 &&
      !countable(static_cast<uint64_t>(info.height), static_cast<uint64_t>(info.width),
                 static_cast<uint64_t>(info.channels))) {
    broken(who, "info reports a sample size of " + size_text(info.height, info.width) + "x" +
                    std::to_string(info.channels) + ", whose bytes overflow 64 bits");
  }
  if (info.target_kind != KILN_TARGET_CLASS && info.target_kind != KILN_TARGET_MULTI_LABEL) {
    broken(who, "info reports target kind " + std::to_string(info.target_kind) +
                    "; KILN_TARGET_CLASS or KILN_TARGET_MULTI_LABEL");
  }
  if (info.reserved2 != 0) {
    broken(who, "kiln_dataset_info field 'reserved2' is " + std::to_string(info.reserved2) +
                    ", not zero");
  }
}

}  // namespace

DatasetSource::DatasetSource(const Component& component, const config::OptionSet& options,
                             int32_t split, uint64_t seed, uint64_t max_pixels)
    : name_(component.name()),
      library_(component.library_path),
      vtable_(static_cast<const kiln_dataset_vtable*>(component.descriptor->vtable)),
      max_pixels_(max_pixels) {
  if (component.kind() != KILN_COMPONENT_DATASET) {
    throw std::invalid_argument("component '" + name_ + "' is a " + kind_name(component.kind()) +
                                ", not a dataset");
  }
  if (split != KILN_SPLIT_TRAIN && split != KILN_SPLIT_VAL) {
    throw std::invalid_argument("dataset '" + name_ + "': unknown split " + std::to_string(split));
  }
  kiln_dataset_open open{};
  open.struct_size = sizeof open;
  open.split = split;
  open.seed = seed;
  open.max_pixels = max_pixels;
  check_options(
      call_plugin([&] { return where("create"); },
                  [&] { return vtable_->create(host_api(), options.c_view(), &open, &instance_); }),
      "dataset '" + name_ + "' refused its options", "data");
  // From here the instance exists: a broken info must still release it.
  try {
    kiln_dataset_info info{};
    info.struct_size = sizeof info;
    check(
        call_plugin([&] { return where("info"); }, [&] { return vtable_->info(instance_, &info); }),
        "dataset '" + name_ + "' info");
    const std::string who = "dataset '" + name_ + "' (" + library_ + ")";
    check_info(info, who);
    multi_label_ = info.target_kind == KILN_TARGET_MULTI_LABEL;
    if (multi_label_ &&
        !(KILN_HAS_FIELD(vtable_, kiln_dataset_vtable, targets) && vtable_->targets != nullptr)) {
      broken(who, "info reports multi-label targets, and the vtable has no targets slot");
    }
    if (info.height > 0 &&
        kiln_pixel_limit(static_cast<uint64_t>(info.height), static_cast<uint64_t>(info.width),
                         max_pixels) == KILN_PIXELS_REFUSE) {
      const std::string reason =
          "every sample is " + size_text(info.height, info.width) + " = " +
          std::to_string(info.height * info.width) + " pixels, more than twice max_image_pixels (" +
          std::to_string(max_pixels) +
          "): raise data.max_image_pixels (0: no limit) if the data is what you meant";
      throw OptionsRefused(KILN_ERR_INVALID_ARGUMENT, "dataset '" + name_ + "': " + reason, "data",
                           reason);
    }
    size_ = info.num_samples;
    num_classes_ = info.num_classes;
    channels_ = info.channels;
    height_ = info.height;
    width_ = info.width;
    if (info.class_names != nullptr) {
      class_names_.reserve(static_cast<size_t>(num_classes_));
      for (int64_t k = 0; k < num_classes_; ++k) {
        const char* text = info.class_names[k];
        if (text == nullptr) broken(who, "class name " + std::to_string(k) + " is NULL");
        class_names_.emplace_back(text);
      }
    }
  } catch (...) {
    call_plugin_noexcept([&] { return where("destroy"); }, [&] { vtable_->destroy(instance_); });
    throw;
  }
}

DatasetSource::~DatasetSource() {
  if (instance_ == nullptr) return;
  call_plugin_noexcept([&] { return where("destroy"); }, [&] { vtable_->destroy(instance_); });
}

std::string DatasetSource::where(const char* entry) const {
  return "dataset '" + name_ + "' " + entry + " (" + library_ + ")";
}

void DatasetSource::fail(kiln_status* status, const char* entry, int64_t index) const {
  const int32_t code = status_code(status);
  const std::string message = take_message(status);
  // The plugin's message names the file and record; the loader adds nothing to it.
  if (code == KILN_ERR_DATA_LOSS) throw data::SampleError(message);
  const std::string what =
      "dataset '" + name_ + "' " + entry + " of sample " + std::to_string(index) + ": " + message;
  if (code == KILN_ERR_INVALID_ARGUMENT && std::string(entry) == "decode") {
    throw std::invalid_argument(what);
  }
  throw ComponentError(code, what);
}

void DatasetSource::check_index(int64_t index) const {
  if (index < 0 || index >= size_) {
    throw std::out_of_range("dataset '" + name_ + "': sample " + std::to_string(index) +
                            " outside [0, " + std::to_string(size_) + ")");
  }
}

std::string DatasetSource::provider() const { return "dataset '" + name_ + "' (" + library_ + ")"; }

std::string DatasetSource::sample_name(int64_t index) const {
  const std::string plain = "sample " + std::to_string(index);
  if (!KILN_HAS_FIELD(vtable_, kiln_dataset_vtable, sample_name) ||
      vtable_->sample_name == nullptr || index < 0 || index >= size_) {
    return plain;
  }
  // Only a message is at stake: a failing slot leaves the index alone.
  try {
    char text[1024] = {};
    kiln_status* status =
        call_plugin([&] { return where("sample_name"); },
                    [&] { return vtable_->sample_name(instance_, index, text, sizeof text); });
    if (status != nullptr) {
      free_status(status);
      return plain;
    }
    text[sizeof text - 1] = '\0';  // a plugin that wrote no terminator is cut at the buffer
    return text[0] == '\0' ? plain : plain + " (" + text + ")";
  } catch (const std::exception&) {
    return plain;
  }
}

void DatasetSource::check_pixels(int64_t index, int64_t height, int64_t width,
                                 const char* entry) const {
  const auto h = static_cast<uint64_t>(height), w = static_cast<uint64_t>(width);
  // Without a limit the bytes must still be countable: refused as a size beyond 64 bits.
  const int verdict = countable(h, w, static_cast<uint64_t>(channels_))
                          ? kiln_pixel_limit(h, w, max_pixels_)
                          : KILN_PIXELS_REFUSE;
  if (verdict == KILN_PIXELS_WITHIN) return;
  const std::string size = size_text(height, width);
  if (verdict == KILN_PIXELS_REFUSE) {
    throw data::SampleError(provider() + " " + entry + ": " + sample_name(index) + " is " + size +
                            ", more than twice data.max_image_pixels (" +
                            std::to_string(max_pixels_) + " pixels): a decompression bomb?");
  }
  {
    std::lock_guard<std::mutex> lock(warned_mutex_);
    if (!warned_.insert(index).second) return;
  }
  spdlog::warn("{} is {}, above data.max_image_pixels ({} pixels; refused above twice that)",
               sample_name(index), size, max_pixels_);
}

data::SampleHeader DatasetSource::probe(int64_t index) const {
  check_index(index);
  kiln_sample_header header{};
  header.struct_size = sizeof header;
  if (kiln_status* status =
          call_plugin([&] { return where("probe"); },
                      [&] { return vtable_->probe(instance_, index, &header); })) {
    fail(status, "probe", index);
  }
  if (header.height <= 0 || header.width <= 0 || header.label < 0 || header.label >= num_classes_) {
    broken(where("probe"), sample_name(index) + " is " + size_text(header.height, header.width) +
                               ", label " + std::to_string(header.label) + " of " +
                               std::to_string(num_classes_) + " classes");
  }
  check_pixels(index, header.height, header.width, "probe");
  return {header.height, header.width, header.label};
}

data::DecodedSample DatasetSource::decode(int64_t index, int scale_denom, uint8_t* pixels,
                                          size_t capacity) const {
  check_index(index);
  if (scale_denom != 1 && scale_denom != 2 && scale_denom != 4 && scale_denom != 8) {
    throw std::invalid_argument("dataset '" + name_ + "': scale_denom " +
                                std::to_string(scale_denom) + " is not 1, 2, 4 or 8");
  }
  kiln_decode_request request{};
  request.struct_size = sizeof request;
  request.scale_denom = scale_denom;
  request.pixels = pixels;
  request.capacity = capacity;
  kiln_decoded_sample out{};
  out.struct_size = sizeof out;
  if (kiln_status* status =
          call_plugin([&] { return where("decode"); },
                      [&] { return vtable_->decode(instance_, index, &request, &out); })) {
    fail(status, "decode", index);
  }
  // What the plugin says it wrote must fit what it was given; anything else means it wrote
  // past the buffer or left the loader reading garbage.
  const bool scale_ok = out.scale >= 1 && scale_denom % out.scale == 0;
  const bool size_ok = out.height > 0 && out.width > 0 &&
                       static_cast<uint64_t>(out.height) <= capacity &&
                       static_cast<uint64_t>(out.width) <= capacity &&
                       static_cast<uint64_t>(out.height) * static_cast<uint64_t>(out.width) *
                               static_cast<uint64_t>(channels_) <=
                           capacity;
  const bool label_ok = out.label >= 0 && out.label < num_classes_;
  if (!scale_ok || !size_ok || !label_ok || out.reserved != 0) {
    broken(where("decode"),
           sample_name(index) + " decoded as " + size_text(out.height, out.width) + "x" +
               std::to_string(channels_) + " into " + std::to_string(capacity) + " bytes, scale " +
               std::to_string(out.scale) + " of " + std::to_string(scale_denom) + ", label " +
               std::to_string(out.label) + ", reserved " + std::to_string(out.reserved));
  }
  // A dataset of one size must decode that size (each side ceil(full / scale)).
  if (height_ > 0) {
    const int64_t s = out.scale;
    if (out.height != (height_ + s - 1) / s || out.width != (width_ + s - 1) / s) {
      broken(where("decode"), sample_name(index) + " decoded as " +
                                  size_text(out.height, out.width) + " at scale 1/" +
                                  std::to_string(s) + "; info reports every sample " +
                                  size_text(height_, width_));
    }
  }
  return {out.height, out.width, out.label, out.scale};
}

void DatasetSource::targets(int64_t index, float* out) const {
  if (!multi_label_) data::Source::targets(index, out);
  check_index(index);
  if (kiln_status* status =
          call_plugin([&] { return where("targets"); },
                      [&] { return vtable_->targets(instance_, index, out, num_classes_); })) {
    fail(status, "targets", index);
  }
  for (int64_t k = 0; k < num_classes_; ++k) {
    // Negated so that NaN fails too.
    if (!(out[k] >= 0.0F && out[k] <= 1.0F)) {
      broken(where("targets"), sample_name(index) + ", class " + std::to_string(k) + ": " +
                                   std::to_string(out[k]) + " is outside [0, 1]");
    }
  }
}

std::unique_ptr<DatasetSource> make_dataset_source(const Registry& registry,
                                                   const std::string& name,
                                                   const config::OptionSet& options, int32_t split,
                                                   uint64_t seed, uint64_t max_pixels) {
  const Component* component = registry.find(KILN_COMPONENT_DATASET, name);
  if (component == nullptr) {
    std::string known;
    for (const Component* c : registry.of_kind(KILN_COMPONENT_DATASET)) {
      known += (known.empty() ? "" : ", ") + std::string(c->name());
    }
    throw std::invalid_argument("no dataset component named '" + name +
                                "'; available: " + (known.empty() ? std::string("none") : known));
  }
  return std::make_unique<DatasetSource>(*component, options, split, seed, max_pixels);
}

config::OptionSet default_options(const Component& component) {
  config::OptionSet set;
  const kiln_component_descriptor* d = component.descriptor;
  for (size_t i = 0; i < d->option_count; ++i) {
    const kiln_option_spec& spec = d->options[i];
    if (spec.default_value == nullptr) continue;
    // The loader checked every default parses.
    if (auto value = config::parse_default(spec)) set.set(spec.name, std::move(*value));
  }
  return set;
}

}  // namespace kiln::plugin
