#include "data/transforms.hpp"

#include <ATen/ops/_upsample_bilinear2d_aa.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace kiln::data {

double uniform(std::mt19937_64& gen, double lo, double hi) {
  const double unit = static_cast<double>(gen() >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * unit;
}

int64_t randint(std::mt19937_64& gen, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(gen() % static_cast<uint64_t>(hi - lo));
}

namespace {

// Python's round(): halves to even (std::nearbyint in the default rounding mode).
int64_t py_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

}  // namespace

CropBox random_resized_crop_params(int64_t height, int64_t width, std::array<double, 2> scale,
                                   std::array<double, 2> ratio, std::mt19937_64& gen) {
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(ratio[0]), log_hi = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * uniform(gen, scale[0], scale[1]);
    const double aspect = std::exp(uniform(gen, log_lo, log_hi));
    const int64_t w = py_round(std::sqrt(target_area * aspect));
    const int64_t h = py_round(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int64_t top = randint(gen, 0, height - h + 1);
      const int64_t left = randint(gen, 0, width - w + 1);
      return {top, left, h, w};
    }
  }
  // Fallback to the central crop, its ratio clamped into the range.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < std::min(ratio[0], ratio[1])) {
    h = py_round(static_cast<double>(w) / std::min(ratio[0], ratio[1]));
  } else if (in_ratio > std::max(ratio[0], ratio[1])) {
    w = py_round(static_cast<double>(h) * std::max(ratio[0], ratio[1]));
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

at::Tensor hwc_view(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels) {
  // from_blob does not write; the const_cast only meets its signature.
  return at::from_blob(const_cast<uint8_t*>(pixels), {1, height, width, channels}, at::kByte)
      .permute({0, 3, 1, 2});
}

at::Tensor resized_crop(const at::Tensor& image, const CropBox& box, int64_t out_height,
                        int64_t out_width) {
  if (box.height <= 0 || box.width <= 0 || box.top < 0 || box.left < 0 ||
      box.top + box.height > image.size(2) || box.left + box.width > image.size(3)) {
    throw std::invalid_argument("resized_crop: the box leaves the image");
  }
  at::Tensor crop = image.slice(2, box.top, box.top + box.height)
                        .slice(3, box.left, box.left + box.width)
                        .contiguous(at::MemoryFormat::ChannelsLast);
  if (box.height == out_height && box.width == out_width) return crop;  // as F.resize: no-op
  return at::_upsample_bilinear2d_aa(crop, {out_height, out_width}, /*align_corners=*/false)
      .contiguous(at::MemoryFormat::ChannelsLast);
}

std::array<int64_t, 2> resize_shorter_size(int64_t height, int64_t width, int64_t size) {
  const bool tall = width <= height;
  const int64_t shorter = tall ? width : height, longer = tall ? height : width;
  const auto other = static_cast<int64_t>(static_cast<double>(size) * static_cast<double>(longer) /
                                          static_cast<double>(shorter));
  return tall ? std::array<int64_t, 2>{other, size} : std::array<int64_t, 2>{size, other};
}

CropBox center_crop_box(int64_t height, int64_t width, int64_t size_h, int64_t size_w) {
  // A side shorter than the crop is padded by floor(difference / 2) before it (torchvision's
  // _center_crop_compute_padding), a longer one cropped at round(difference / 2).
  const auto anchor = [](int64_t side, int64_t size) {
    return size > side ? -((size - side) / 2) : py_round(static_cast<double>(side - size) / 2.0);
  };
  return {anchor(height, size_h), anchor(width, size_w), size_h, size_w};
}

void crop_hwc(const uint8_t* src, int64_t height, int64_t width, int64_t channels,
              const CropBox& box, bool flip, uint8_t* out) {
  const int64_t x_begin = std::clamp<int64_t>(-box.left, 0, box.width);
  const int64_t x_end = std::clamp<int64_t>(width - box.left, x_begin, box.width);
  const auto row_bytes = static_cast<size_t>(box.width * channels);
  for (int64_t y = 0; y < box.height; ++y) {
    uint8_t* row = out + y * box.width * channels;
    const int64_t sy = y + box.top;
    if (sy < 0 || sy >= height) {
      std::memset(row, 0, row_bytes);
      continue;
    }
    std::memset(row, 0, static_cast<size_t>(x_begin * channels));
    if (x_end > x_begin) {
      std::memcpy(row + x_begin * channels, src + (sy * width + box.left + x_begin) * channels,
                  static_cast<size_t>((x_end - x_begin) * channels));
    }
    std::memset(row + x_end * channels, 0, static_cast<size_t>((box.width - x_end) * channels));
    if (flip) {
      for (int64_t a = 0, b = box.width - 1; a < b; ++a, --b) {
        std::swap_ranges(row + a * channels, row + (a + 1) * channels, row + b * channels);
      }
    }
  }
}

int decode_denominator(int64_t box_height, int64_t box_width, int64_t out_height,
                       int64_t out_width) {
  for (int d : {8, 4, 2}) {
    if (box_height >= d * out_height && box_width >= d * out_width) return d;
  }
  return 1;
}

CropBox scale_box(const CropBox& box, int scale, int64_t reduced_h, int64_t reduced_w) {
  if (scale <= 1) return box;
  const int64_t top = std::min(box.top / scale, reduced_h - 1);
  const int64_t left = std::min(box.left / scale, reduced_w - 1);
  const int64_t bottom = std::min((box.top + box.height + scale - 1) / scale, reduced_h);
  const int64_t right = std::min((box.left + box.width + scale - 1) / scale, reduced_w);
  return {top, left, std::max<int64_t>(bottom - top, 1), std::max<int64_t>(right - left, 1)};
}

}  // namespace kiln::data
