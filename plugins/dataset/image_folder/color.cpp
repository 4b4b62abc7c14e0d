#include "color.hpp"

#include <cstring>

namespace kiln::image_folder {
namespace {

// PIL's L24 (Convert.c): ITU-R 601-2 luma in 16-bit fixed point, rounded to nearest.
inline uint8_t luma(uint32_t r, uint32_t g, uint32_t b) {
  return static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

// PIL's cmyk2rgb after its "CMYK;I" raw mode (Adobe polarity: stored values inverted):
// channel = 255 - k - c * (255 - k) / 255 with PIL's rounding (MULDIV255).
inline uint8_t cmyk_channel(uint32_t stored_c, uint32_t stored_k) {
  const int c = 255 - static_cast<int>(stored_c);
  const int nk = static_cast<int>(stored_k);  // 255 - k, k being the inverted stored value
  const int tmp = c * nk + 128;
  const int v = nk - (((tmp >> 8) + tmp) >> 8);
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

}  // namespace

int channels_of(Layout layout) {
  switch (layout) {
    case Layout::gray:
      return 1;
    case Layout::gray_alpha:
      return 2;
    case Layout::rgb:
      return 3;
    case Layout::rgba:
    case Layout::cmyk:
      return 4;
  }
  return 0;
}

void convert(const uint8_t* in, Layout layout, size_t pixels, uint8_t* out, int channels) {
  const int from = channels_of(layout);
  if (layout != Layout::cmyk && from == channels) {
    if (in != out) std::memcpy(out, in, pixels * static_cast<size_t>(from));
    return;
  }
  for (size_t i = 0; i < pixels; ++i) {
    const uint8_t* p = in + i * static_cast<size_t>(from);
    uint8_t r, g, b;
    if (layout == Layout::gray || layout == Layout::gray_alpha) {
      if (channels == 1) {
        out[i] = p[0];
        continue;
      }
      r = g = b = p[0];
    } else if (layout == Layout::cmyk) {
      r = cmyk_channel(p[0], p[3]);
      g = cmyk_channel(p[1], p[3]);
      b = cmyk_channel(p[2], p[3]);
    } else {
      r = p[0];
      g = p[1];
      b = p[2];
    }
    if (channels == 1) {
      out[i] = luma(r, g, b);
    } else {
      out[3 * i] = r;
      out[3 * i + 1] = g;
      out[3 * i + 2] = b;
    }
  }
}

}  // namespace kiln::image_folder
