// torchvision's image transforms on HWC uint8 samples, as pure functions, and their parameter
// samplers drawn from Kiln's seeded std::mt19937_64 streams (torchvision draws from torch's
// global generator: the same parameters give the same pixels, the draws themselves differ).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <random>

namespace kiln::data {

// A crop of rows [top, top + height) and columns [left, left + width).
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
  bool operator==(const CropBox& o) const {
    return top == o.top && left == o.left && height == o.height && width == o.width;
  }
};

// Uniform in [lo, hi) from the generator's top 53 bits: the same on every platform, unlike
// std::uniform_real_distribution.
double uniform(std::mt19937_64& gen, double lo, double hi);
// Uniform integer in [lo, hi) (hi > lo), as torch.randint(lo, hi).
int64_t randint(std::mt19937_64& gen, int64_t lo, int64_t hi);

// RandomResizedCrop.get_params: ten tries of an area fraction uniform in `scale` and a
// log-uniform aspect ratio (w/h) in `ratio`, each kept if it fits the height x width image;
// then the central crop clamped to the ratio range.
CropBox random_resized_crop_params(int64_t height, int64_t width, std::array<double, 2> scale,
                                   std::array<double, 2> ratio, std::mt19937_64& gen);

// A view of an HWC uint8 buffer as a 1 x C x H x W channels-last tensor (no copy).
at::Tensor hwc_view(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels);

// Bilinear resize with antialiasing (torchvision's F.resize(antialias=True) on a uint8 tensor,
// the ATen kernel it calls) of `box` of `image` (1 x C x H x W uint8, any layout) to
// out_height x out_width: torchvision's F.resized_crop. Returns 1 x C x oh x ow channels-last.
at::Tensor resized_crop(const at::Tensor& image, const CropBox& box, int64_t out_height,
                        int64_t out_width);

// Resize(size) of an int: the shorter side becomes `size`, the longer int(size * long / short)
// (torchvision's _compute_resized_output_size). {height, width}.
std::array<int64_t, 2> resize_shorter_size(int64_t height, int64_t width, int64_t size);

// CenterCrop(size)'s box: top = int(round((height - size) / 2.0)), likewise left; where the
// image is smaller than the crop, -floor((size - height) / 2): torchvision's zero padding.
CropBox center_crop_box(int64_t height, int64_t width, int64_t size_h, int64_t size_w);

// Copies `box` of the HWC image into out (box.height x box.width x C), zeros where the box
// leaves the image: torchvision's pad-then-crop (CenterCrop of a small image, RandomCrop with
// zero padding), mirrored left-right if `flip`.
void crop_hwc(const uint8_t* src, int64_t height, int64_t width, int64_t channels,
              const CropBox& box, bool flip, uint8_t* out);

// The largest decode reduction d in {1, 2, 4, 8} with both sides of `box` at least d times the
// output's: the reduced crop still holds as many pixels as the output (libjpeg-turbo's DCT
// scaling; a decoder may use less).
int decode_denominator(int64_t box_height, int64_t box_width, int64_t out_height,
                       int64_t out_width);

// `box` (at full scale) in an image decoded at 1/scale to reduced_h x reduced_w: the edges
// move to floor(edge / scale) and ceil(edge / scale), so the reduced box covers the full one.
CropBox scale_box(const CropBox& box, int scale, int64_t reduced_h, int64_t reduced_w);

}  // namespace kiln::data
