#include "jpeg.hpp"

#include <turbojpeg.h>

#include <cstring>
#include <memory>
#include <vector>

#include "color.hpp"
#include "kiln/sdk.hpp"

namespace kiln::image_folder {
namespace {

// A decompressor for one call: cheap to make next to a decode, and nothing shared between the
// loader threads.
struct Handle {
  Handle() : tj(tjInitDecompress()) {
    if (tj == nullptr) throw Error(KILN_ERR_OUT_OF_MEMORY, "image_folder: tjInitDecompress failed");
  }
  ~Handle() { tjDestroy(tj); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  tjhandle tj;
};

[[noreturn]] void corrupt(const std::string& path, const Handle& h) {
  throw Error(KILN_ERR_DATA_LOSS,
              "image_folder: '" + path + "' is not a readable JPEG: " + tjGetErrorStr2(h.tj));
}

struct Raw {
  int width = 0, height = 0, colorspace = 0;
};

bool read_header(const Handle& h, const uint8_t* data, size_t size, Raw* out) {
  int subsamp = 0;
  return tjDecompressHeader3(h.tj, data, static_cast<unsigned long>(size), &out->width,
                             &out->height, &subsamp, &out->colorspace) == 0 &&
         out->width > 0 && out->height > 0;
}

int channels_of_colorspace(int colorspace) { return colorspace == TJCS_GRAY ? 1 : 3; }

// The largest reduction 1/d offered by the library with d dividing scale_denom.
int pick_scale(int scale_denom) {
  int count = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&count);
  for (int d : {8, 4, 2}) {
    if (scale_denom % d != 0) continue;
    for (int i = 0; i < count && factors != nullptr; ++i) {
      if (factors[i].num == 1 && factors[i].denom == d) return d;
    }
  }
  return 1;
}

}  // namespace

bool jpeg_header(const uint8_t* data, size_t size, const std::string& path, Header* out) {
  Handle h;
  Raw raw;
  if (!read_header(h, data, size, &raw)) return false;
  out->height = raw.height;
  out->width = raw.width;
  out->channels = channels_of_colorspace(raw.colorspace);
  return true;
}

Decoded jpeg_decode(const uint8_t* data, size_t size, const std::string& path, int scale_denom,
                    int channels, uint8_t* pixels, size_t capacity, uint64_t max_pixels) {
  Handle h;
  Raw raw;
  if (!read_header(h, data, size, &raw)) corrupt(path, h);
  // Before libjpeg allocates anything of the image's size (a progressive JPEG's coefficients).
  check_pixels(path, raw.height, raw.width, max_pixels);
  const int d = pick_scale(scale_denom);
  const tjscalingfactor factor{1, d};
  Decoded out;
  out.width = TJSCALED(raw.width, factor);
  out.height = TJSCALED(raw.height, factor);
  out.scale = d;
  const size_t count = static_cast<size_t>(out.width) * static_cast<size_t>(out.height);
  if (count * static_cast<size_t>(channels) > capacity) {
    throw Error(KILN_ERR_INVALID_ARGUMENT,
                "image_folder: decode of '" + path + "' needs " + std::to_string(out.height) +
                    " x " + std::to_string(out.width) + " x " + std::to_string(channels) +
                    " bytes; the buffer holds " + std::to_string(capacity));
  }
  Layout layout = Layout::rgb;
  int format = TJPF_RGB;
  if (raw.colorspace == TJCS_GRAY) {
    layout = Layout::gray;
    format = TJPF_GRAY;
  } else if (raw.colorspace == TJCS_CMYK || raw.colorspace == TJCS_YCCK) {
    layout = Layout::cmyk;  // libjpeg converts YCCK to CMYK; PIL reads both as CMYK
    format = TJPF_CMYK;
  }
  const bool direct = layout != Layout::cmyk && channels_of(layout) == channels;
  std::vector<uint8_t> scratch;
  uint8_t* target = pixels;
  if (!direct) {
    scratch.resize(count * static_cast<size_t>(channels_of(layout)));
    target = scratch.data();
  }
  // flags 0: the accurate integer DCT and fancy upsampling, PIL's (libjpeg's) defaults.
  if (tjDecompress2(h.tj, data, static_cast<unsigned long>(size), target,
                    static_cast<int>(out.width), 0, static_cast<int>(out.height), format, 0) != 0) {
    // A warning leaves a whole image: libjpeg recovers from corrupt entropy data as PIL does,
    // but a file that ends early is padded with gray, which PIL refuses ("image file is
    // truncated"). libjpeg keeps the message of the first warning only; a truncation is the
    // first unless the file was damaged before its end too.
    const bool warning = tjGetErrorCode(h.tj) == TJERR_WARNING;
    if (!warning || std::strstr(tjGetErrorStr2(h.tj), "Premature end of JPEG file") != nullptr) {
      corrupt(path, h);
    }
  }
  if (!direct) convert(target, layout, count, pixels, channels);
  return out;
}

}  // namespace kiln::image_folder
