// Pixel conversions as PIL's Image.convert makes them, so decoded samples equal torchvision's
// ImageFolder loader (Image.open(path).convert("RGB"), or "L" for gray).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::image_folder {

// What a decoder wrote, interleaved 8-bit.
enum class Layout {
  gray,        // L
  gray_alpha,  // LA: alpha dropped
  rgb,         // RGB
  rgba,        // RGBA: alpha dropped (convert("RGB") does not composite)
  cmyk         // a JPEG's CMYK as stored; PIL assumes Adobe's inverted polarity
};

int channels_of(Layout layout);

// Converts `pixels` of `layout` into `channels` (1: L, 3: RGB) at `out`; `out` may equal `in`
// only when the layout already has `channels` channels (then it is left as is).
void convert(const uint8_t* in, Layout layout, size_t pixels, uint8_t* out, int channels);

}  // namespace kiln::image_folder
