// Where the loader's samples come from: a dataset component (data/plugin_source.hpp) or tensors
// in memory (TensorSource). The loader asks for a sample's size and label, then decodes it into
// its own buffer, from its worker threads; everything after the pixels is the loader's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln::data {

// A sample that cannot be read (a missing, truncated or corrupt file): the message names it. The
// loader skips and counts such samples or stops, as data.on_error says.
class SampleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A source that broke its own contract: a dataset plugin that reports an impossible size or
// decodes another size than it reported. No fault of a sample, so never skipped; the message
// names the plugin, and the CLI refuses it (exit 3, as a refused library).
class BrokenSource : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// PIL's Image.MAX_IMAGE_PIXELS, the default of data.max_image_pixels: a sample of more pixels
// is decoded with a warning, one of more than twice as many refused (kiln_pixel_limit).
constexpr uint64_t kDefaultMaxImagePixels = 89478485;

struct SampleHeader {
  int64_t height = 0;  // at full scale
  int64_t width = 0;
  int64_t label = 0;
};

struct DecodedSample {
  int64_t height = 0;  // rows written
  int64_t width = 0;
  int64_t label = 0;
  int scale = 1;  // the reduction used: each side is ceil(full / scale)
};

class Source {
 public:
  virtual ~Source() = default;
  virtual int64_t size() const = 0;
  virtual int64_t num_classes() const = 0;
  virtual int64_t channels() const = 0;
  // The size every sample shares, or {0, 0} when they differ.
  virtual int64_t fixed_height() const = 0;
  virtual int64_t fixed_width() const = 0;
  // Class names (an image folder's sub-folders), or empty.
  virtual std::vector<std::string> class_names() const { return {}; }
  // Sample `index` as a message names it: "sample 8 (root/c1/b.png)" where the source knows
  // its file, else "sample 8". Never throws for an index in range.
  virtual std::string sample_name(int64_t index) const;
  // Who provides the samples, for messages ("dataset 'image_folder' (/path/lib.so)"), or "".
  virtual std::string provider() const { return ""; }
  // Multi-label: each sample's target is a row of num_classes values in [0, 1] (targets()), and
  // its header's label means nothing.
  virtual bool multi_label() const { return false; }
  // Writes sample `index`'s target row (num_classes floats) to `out`. Throws SampleError as
  // decode does, std::logic_error for a source that is not multi-label. Thread-safe.
  virtual void targets(int64_t index, float* out) const;
  // Size and label without decoding. Thread-safe.
  virtual SampleHeader probe(int64_t index) const = 0;
  // Decodes sample `index` as height x width x channels uint8 (HWC) into `pixels`, reduced by a
  // factor that divides `scale_denom` (1, 2, 4, 8) where the format allows. Throws SampleError
  // for unreadable data, std::invalid_argument when `capacity` is too small. Thread-safe.
  virtual DecodedSample decode(int64_t index, int scale_denom, uint8_t* pixels,
                               size_t capacity) const = 0;
};

// Samples held in memory: uint8 images N x C x H x W (IDX's layout) or N x H x W x C, with int64
// labels [N], or float32 target rows [N, num_classes] in [0, 1] (multi-label). Used by the tests
// and by formats small enough to read whole.
class TensorSource final : public Source {
 public:
  enum class Layout { NCHW, NHWC };
  // Throws std::invalid_argument for a wrong dtype, rank, a label outside [0, num_classes), or
  // target rows of another width or with a value outside [0, 1].
  TensorSource(at::Tensor images, at::Tensor labels, int64_t num_classes,
               Layout layout = Layout::NCHW);

  int64_t size() const override { return labels_.size(0); }
  int64_t num_classes() const override { return num_classes_; }
  bool multi_label() const override { return labels_.dim() == 2; }
  void targets(int64_t index, float* out) const override;
  int64_t channels() const override { return channels_; }
  int64_t fixed_height() const override { return height_; }
  int64_t fixed_width() const override { return width_; }
  SampleHeader probe(int64_t index) const override;
  DecodedSample decode(int64_t index, int scale_denom, uint8_t* pixels,
                       size_t capacity) const override;

  const at::Tensor& images() const { return images_; }  // as given, contiguous
  const at::Tensor& labels() const { return labels_; }

 private:
  at::Tensor images_, labels_;
  int64_t num_classes_;
  Layout layout_;
  int64_t channels_ = 0, height_ = 0, width_ = 0;
};

}  // namespace kiln::data
