#include "data/assembler.hpp"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <random>

namespace kiln::data {

BatchAssembler::BatchAssembler(const Dataset& dataset, const LoaderOptions& options)
    : images_(dataset.images),
      labels_(dataset.labels),
      options_(options),
      channels_(dataset.images.size(1)),
      height_(dataset.images.size(2)),
      width_(dataset.images.size(3)),
      pin_(options.pin_memory && at::hasCUDA()) {}

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

// Writes the crop of the zero-padded sample at offset (dy, dx), mirrored if `flip`.
void BatchAssembler::copy_sample(const uint8_t* src, uint8_t* dst, int64_t dy, int64_t dx,
                                 bool flip) const {
  const int64_t pad = options_.crop_padding;
  // Output columns [x_begin, x_end) come from source columns shifted by dx - pad.
  const int64_t shift_x = dx - pad;
  const int64_t x_begin = std::clamp<int64_t>(-shift_x, 0, width_);
  const int64_t x_end = std::clamp<int64_t>(width_ - shift_x, x_begin, width_);
  for (int64_t c = 0; c < channels_; ++c) {
    const uint8_t* plane = src + c * height_ * width_;
    for (int64_t y = 0; y < height_; ++y) {
      uint8_t* row = dst + (c * height_ + y) * width_;
      const int64_t sy = y + dy - pad;
      if (sy < 0 || sy >= height_) {
        std::memset(row, 0, static_cast<size_t>(width_));
        continue;
      }
      std::memset(row, 0, static_cast<size_t>(x_begin));
      if (x_end > x_begin) {
        std::memcpy(row + x_begin, plane + sy * width_ + x_begin + shift_x,
                    static_cast<size_t>(x_end - x_begin));
      }
      std::memset(row + x_end, 0, static_cast<size_t>(width_ - x_end));
      if (flip) std::reverse(row, row + width_);
    }
  }
}

Batch BatchAssembler::build(const int64_t* indices, int64_t count, int64_t epoch,
                            int64_t batch_index, std::vector<uint8_t>& scratch) const {
  // data_ptr<T> checks the dtype, so a malformed dataset fails here, inside the batch.
  const uint8_t* pixels = images_.data_ptr<uint8_t>();
  const int64_t* labels = labels_.data_ptr<int64_t>();
  const int64_t sample_bytes = channels_ * height_ * width_;
  scratch.resize(static_cast<size_t>(std::max<int64_t>(count * sample_bytes, 1)));

  at::Tensor out_labels = allocate({count}, at::kLong);
  int64_t* out_lab = out_labels.data_ptr<int64_t>();

  const bool crop = options_.crop_padding > 0;
  const bool augment = crop || options_.flip;
  // Seeded only for augmentation: constructing the engine fills its 312-word state, a cost a
  // batch without augmentation need not pay.
  std::optional<std::mt19937_64> gen;
  if (augment) {
    const auto s = options_.seed;
    const auto e = static_cast<uint64_t>(epoch);
    const auto b = static_cast<uint64_t>(batch_index);
    // The tag keeps this stream apart from the epoch permutation's (same seed, epoch).
    std::vector<uint32_t> words{uint32_t(s), uint32_t(s >> 32), uint32_t(e), uint32_t(e >> 32),
                                uint32_t(b), uint32_t(b >> 32), 0x61756735u};
    // Ranks build different samples at the same batch index: give each its own stream.
    if (options_.world_size > 1) words.push_back(static_cast<uint32_t>(options_.rank));
    std::seed_seq seq(words.begin(), words.end());
    gen.emplace(seq);
  }
  const uint64_t offsets = static_cast<uint64_t>(2 * options_.crop_padding + 1);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = indices[i];
    out_lab[i] = labels[row];
    const uint8_t* src = pixels + row * sample_bytes;
    uint8_t* dst = scratch.data() + i * sample_bytes;
    if (!augment) {
      std::memcpy(dst, src, static_cast<size_t>(sample_bytes));
      continue;
    }
    const int64_t dy = crop ? static_cast<int64_t>((*gen)() % offsets) : options_.crop_padding;
    const int64_t dx = crop ? static_cast<int64_t>((*gen)() % offsets) : options_.crop_padding;
    const bool flip = options_.flip && ((*gen)() & 1) != 0;
    copy_sample(src, dst, dy, dx, flip);
  }

  const std::vector<int64_t> shape{count, channels_, height_, width_};
  at::Tensor images = allocate(shape, at::kFloat);
  images.copy_(at::from_blob(scratch.data(), shape, at::kByte));
  // Same operation order as torchvision's ToTensor + Normalize.
  images.div_(255.0).sub_(options_.mean).div_(options_.std);
  return Batch{std::move(images), std::move(out_labels), batch_index};
}

}  // namespace kiln::data
