#include "data/assembler.hpp"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/tensor.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

namespace kiln::data {

namespace {

// Stream tags: the augmentation's and the mixing's streams stay apart from each other and from
// the epoch permutation's (same seed, epoch).
constexpr uint32_t kAugmentTag = 0x61756735u;
constexpr uint32_t kMixTag = 0x6d697821u;

bool all_equal(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [&](double x) { return x == v.front(); });
}

size_t bytes(int64_t h, int64_t w, int64_t c) { return static_cast<size_t>(h * w * c); }

}  // namespace

BatchAssembler::BatchAssembler(const Source& source, const LoaderOptions& options)
    : source_(source),
      options_(options),
      channels_(source.channels()),
      out_h_(source.fixed_height()),
      out_w_(source.fixed_width()),
      plain_(false),
      pin_(options.pin_memory && at::hasCUDA()) {
  const bool fixed = out_h_ > 0 && out_w_ > 0;
  if (options_.rrc_size > 0) {
    out_h_ = out_w_ = options_.rrc_size;
  } else if (options_.center_crop > 0) {
    out_h_ = out_w_ = options_.center_crop;
  } else if (options_.resize > 0 && fixed) {
    const auto size = resize_shorter_size(out_h_, out_w_, options_.resize);
    out_h_ = size[0];
    out_w_ = size[1];
  } else if (!fixed) {
    // A folder whose images may all share one size (MNIST as PNGs): the first sample's, checked
    // for every sample from its header before it is decoded.
    const SampleHeader first = first_sample();
    out_h_ = first.height;
    out_w_ = first.width;
    if (options_.resize > 0) {  // then every sample must resize to sample 0's size
      const auto size = resize_shorter_size(out_h_, out_w_, options_.resize);
      out_h_ = size[0];
      out_w_ = size[1];
    } else {
      plain_ = true;
      check_sizes_ = true;
    }
  } else {
    plain_ = true;
  }
  for (const auto* list : {&options_.mean, &options_.std}) {
    if (list->size() != 1 && static_cast<int64_t>(list->size()) != channels_) {
      throw std::invalid_argument(std::string(list == &options_.mean ? "mean" : "std") + " has " +
                                  std::to_string(list->size()) + " values for images of " +
                                  std::to_string(channels_) + " channels");
    }
  }
}

SampleHeader BatchAssembler::first_sample() {
  if (!options_.skip_bad_samples) return source_.probe(0);
  // Under skip, the first sample that decodes: an unreadable one sorted first is skipped (and
  // replaced when a batch meets it), as one anywhere else is.
  std::vector<uint8_t> pixels;
  std::string first_error;
  for (int64_t i = 0; i < source_.size(); ++i) {
    try {
      const SampleHeader header = source_.probe(i);
      pixels.resize(bytes(header.height, header.width, channels_));
      const DecodedSample s = source_.decode(i, 1, pixels.data(), pixels.size());
      check_decoded(i, header, s);
      first_index_ = i;
      return header;
    } catch (const SampleError& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  throw SampleError("none of the " + std::to_string(source_.size()) +
                    " samples can be read (data.on_error = \"skip\"); the first: " + first_error);
}

void BatchAssembler::check_decoded(int64_t index, const SampleHeader& header,
                                   const DecodedSample& s) const {
  const int64_t d = s.scale;
  if (s.height == (header.height + d - 1) / d && s.width == (header.width + d - 1) / d) return;
  broken(index, "decoded as " + std::to_string(s.height) + "x" + std::to_string(s.width) +
                    " at scale 1/" + std::to_string(d) + "; probe reported " +
                    std::to_string(header.height) + "x" + std::to_string(header.width));
}

void BatchAssembler::broken(int64_t index, const std::string& what) const {
  const std::string who = source_.provider().empty() ? "the source" : source_.provider();
  throw BrokenSource(who + " broke the dataset contract: " + source_.sample_name(index) + " " +
                     what);
}

void BatchAssembler::differ(int64_t index, int64_t height, int64_t width, const char* after) const {
  // Not a SampleError: skipping would not help, the pipeline needs a crop.
  throw std::invalid_argument(
      source_.sample_name(index) + " is " + std::to_string(height) + "x" + std::to_string(width) +
      after + ", " + source_.sample_name(first_index_) + " " + std::to_string(out_h_) + "x" +
      std::to_string(out_w_) +
      ": samples differ in size: set data.random_resized_crop or data.resize + "
      "data.center_crop");
}

at::Tensor BatchAssembler::allocate(at::IntArrayRef shape, at::ScalarType dtype) const {
  if (pin_.load(std::memory_order_relaxed)) {
    try {
      return at::empty(shape, at::TensorOptions().dtype(dtype).pinned_memory(true));
    } catch (const std::exception&) {
      pin_ = false;  // CUDA is present but its host allocator is not usable: stay pageable
    }
  }
  return at::empty(shape, at::TensorOptions().dtype(dtype));
}

std::mt19937_64 BatchAssembler::stream(int64_t epoch, int64_t batch_index, uint32_t tag) const {
  const auto s = options_.seed;
  const auto e = static_cast<uint64_t>(epoch);
  const auto b = static_cast<uint64_t>(batch_index);
  std::vector<uint32_t> words{uint32_t(s), uint32_t(s >> 32), uint32_t(e), uint32_t(e >> 32),
                              uint32_t(b), uint32_t(b >> 32), tag};
  // Ranks build different samples at the same batch index: give each its own stream.
  if (options_.world_size > 1) words.push_back(static_cast<uint32_t>(options_.rank));
  std::seed_seq seq(words.begin(), words.end());
  return std::mt19937_64(seq);
}

int64_t BatchAssembler::load_plain(int64_t index, uint8_t* dst) const {
  DecodedSample s;
  try {
    s = source_.decode(index, 1, dst, bytes(out_h_, out_w_, channels_));
  } catch (const std::invalid_argument&) {
    // Sources refuse a buffer too small for the sample: a larger one than the first, if that
    // is why (the header is read only then, not for every sample).
    if (check_sizes_) check_same_size(index, source_.probe(index));
    throw;
  }
  if (s.height != out_h_ || s.width != out_w_) {
    if (!check_sizes_) {
      broken(index, "decoded as " + std::to_string(s.height) + "x" + std::to_string(s.width) +
                        "; every sample is " + std::to_string(out_h_) + "x" +
                        std::to_string(out_w_));
    }
    // Another size than the first sample's: its header says whether the image is another size
    // or the source decoded another size than it reports.
    const SampleHeader header = source_.probe(index);
    check_decoded(index, header, s);
    check_same_size(index, header);
  }
  return s.label;
}

int64_t BatchAssembler::load_sample(int64_t index, std::mt19937_64* gen, Scratch& scratch,
                                    uint8_t* dst) const {
  if (plain_) return load_plain(index, dst);
  const SampleHeader header = source_.probe(index);
  int denom = 1;
  CropBox box;
  if (options_.rrc_size > 0) {
    box = random_resized_crop_params(header.height, header.width, options_.rrc_scale,
                                     options_.rrc_ratio, *gen);
    if (options_.decode_scaled) denom = decode_denominator(box.height, box.width, out_h_, out_w_);
  } else if (options_.resize > 0 && options_.decode_scaled) {
    const int64_t shorter = std::min(header.height, header.width);
    denom = decode_denominator(shorter, shorter, options_.resize, options_.resize);
  }
  try {
    scratch.decode.resize(std::max<size_t>(bytes(header.height, header.width, channels_), 1));
  } catch (const std::bad_alloc&) {
    // A large image under a memory cap: this sample cannot be read here, which on_error handles.
    throw SampleError(source_.sample_name(index) + " is " + std::to_string(header.height) + "x" +
                      std::to_string(header.width) + ": out of memory for its decode");
  }
  const DecodedSample s =
      source_.decode(index, denom, scratch.decode.data(), scratch.decode.size());
  check_decoded(index, header, s);
  const at::Tensor image = hwc_view(scratch.decode.data(), s.height, s.width, channels_);
  const auto copy_out = [&](const at::Tensor& t) {  // 1 x C x out_h x out_w channels-last
    std::memcpy(dst, t.data_ptr<uint8_t>(), bytes(out_h_, out_w_, channels_));
  };
  if (options_.rrc_size > 0) {
    copy_out(resized_crop(image, scale_box(box, s.scale, s.height, s.width), out_h_, out_w_));
    return s.label;
  }
  // Resize of the shorter side (to torchvision's size, computed at full scale), center crop.
  at::Tensor resized = image;
  if (options_.resize > 0) {
    const auto size = resize_shorter_size(header.height, header.width, options_.resize);
    resized = resized_crop(image, {0, 0, s.height, s.width}, size[0], size[1]);
  }
  if (options_.center_crop > 0) {
    resized = resized.contiguous(at::MemoryFormat::ChannelsLast);
    const int64_t h = resized.size(2), w = resized.size(3);
    crop_hwc(resized.data_ptr<uint8_t>(), h, w, channels_,
             center_crop_box(h, w, options_.center_crop, options_.center_crop), false, dst);
  } else {
    if (resized.size(2) != out_h_ || resized.size(3) != out_w_) {
      differ(index, resized.size(2), resized.size(3), " after resizing");
    }
    copy_out(resized.contiguous(at::MemoryFormat::ChannelsLast));
  }
  return s.label;
}

void BatchAssembler::check_same_size(int64_t index, const SampleHeader& header) const {
  if (header.height != out_h_ || header.width != out_w_)
    differ(index, header.height, header.width, "");
}

int64_t BatchAssembler::load_or_replace(int64_t index, std::mt19937_64* gen, Scratch& scratch,
                                        uint8_t* dst, float* targets) const {
  const int64_t n = source_.size();
  for (int64_t tries = 0;; ++tries) {
    try {
      const int64_t label = load_sample(index, gen, scratch, dst);
      if (targets != nullptr) source_.targets(index, targets);
      return label;
    } catch (const SampleError& e) {
      if (!options_.skip_bad_samples || tries + 1 >= n) throw;
      // One replaced sample however many unreadable ones its replacement passed over.
      if (tries == 0) ++skipped_;
      {
        std::lock_guard<std::mutex> lock(logged_mutex_);
        if (logged_.insert(index).second) {
          spdlog::warn("data.on_error = \"skip\": {}; sample {} replaced by sample {}", e.what(),
                       index, (index + 1) % n);
        }
      }
      // The next index: the same replacement whichever worker or run builds this batch.
      index = (index + 1) % n;
    }
  }
}

void BatchAssembler::normalise(at::Tensor& images) const {
  // Same operation order as torchvision's ToTensor + Normalize; a single value stays a scalar
  // (the arithmetic the loader always did).
  images.div_(255.0);
  const auto apply = [&](const std::vector<double>& v, bool subtract) {
    if (all_equal(v)) {
      subtract ? images.sub_(v.front()) : images.div_(v.front());
      return;
    }
    const at::Tensor t = at::tensor(v, at::kFloat).view({1, channels_, 1, 1});
    subtract ? images.sub_(t) : images.div_(t);
  };
  apply(options_.mean, true);
  apply(options_.std, false);
}

Batch BatchAssembler::build(const int64_t* indices, int64_t count, int64_t epoch,
                            int64_t batch_index, Scratch& scratch) const {
  const size_t sample_bytes = bytes(out_h_, out_w_, channels_);
  scratch.batch.resize(std::max<size_t>(static_cast<size_t>(count) * sample_bytes, 1));

  at::Tensor out_labels = allocate({count}, at::kLong);
  int64_t* out_lab = out_labels.data_ptr<int64_t>();
  // Multi-label: each sample's target row, beside its (unused) label.
  const int64_t classes = source_.num_classes();
  at::Tensor out_targets;
  if (source_.multi_label()) out_targets = allocate({count, classes}, at::kFloat);

  const bool crop = options_.crop_padding > 0;
  const bool pad_or_flip = crop || options_.flip;
  // Seeded only for augmentation: constructing the engine fills its 312-word state, a cost a
  // batch without augmentation need not pay.
  std::optional<std::mt19937_64> gen;
  if (pad_or_flip || options_.rrc_size > 0) gen.emplace(stream(epoch, batch_index, kAugmentTag));
  if (pad_or_flip) scratch.sample.resize(sample_bytes);
  const uint64_t offsets = static_cast<uint64_t>(2 * options_.crop_padding + 1);
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* dst = scratch.batch.data() + static_cast<size_t>(i) * sample_bytes;
    std::mt19937_64* g = gen ? &*gen : nullptr;
    float* row = out_targets.defined() ? out_targets.data_ptr<float>() + i * classes : nullptr;
    out_lab[i] =
        load_or_replace(indices[i], g, scratch, pad_or_flip ? scratch.sample.data() : dst, row);
    if (!pad_or_flip) continue;
    // Draw order (dy, dx, flip) per sample: the batches of earlier releases.
    const int64_t dy = crop ? static_cast<int64_t>((*gen)() % offsets) : options_.crop_padding;
    const int64_t dx = crop ? static_cast<int64_t>((*gen)() % offsets) : options_.crop_padding;
    const bool flip = options_.flip && ((*gen)() & 1) != 0;
    const CropBox box{dy - options_.crop_padding, dx - options_.crop_padding, out_h_, out_w_};
    crop_hwc(scratch.sample.data(), out_h_, out_w_, channels_, box, flip, dst);
  }

  const std::vector<int64_t> shape{count, channels_, out_h_, out_w_};
  at::Tensor images = allocate(shape, at::kFloat);
  images.copy_(at::from_blob(scratch.batch.data(), {count, out_h_, out_w_, channels_}, at::kByte)
                   .permute({0, 3, 1, 2}));
  normalise(images);
  Batch batch{std::move(images), std::move(out_labels), std::move(out_targets), batch_index};
  if (options_.mix.enabled()) {
    std::mt19937_64 mix_gen = stream(epoch, batch_index, kMixTag);
    const MixParams params = draw_mix(options_.mix, out_h_, out_w_, mix_gen);
    apply_mix(batch.images, params);
    batch.targets = batch.targets.defined() ? mix_rows(batch.targets, params.lambda)
                                            : mix_targets(batch.labels, classes, params.lambda,
                                                          options_.mix.label_smoothing);
  }
  return batch;
}

}  // namespace kiln::data
