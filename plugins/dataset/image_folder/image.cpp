#include "image.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "color.hpp"
#include "jpeg.hpp"
#include "kiln/dataset.h"
#include "kiln/sdk.hpp"
#include "png_decode.h"

namespace kiln::image_folder {
namespace {

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
// Enough for the headers of most JPEGs in one read; longer ones (big EXIF thumbnails or ICC
// profiles) are read whole.
constexpr size_t kProbeBytes = 16 * 1024;

[[noreturn]] void data_loss(const std::string& path, const std::string& what) {
  throw Error(KILN_ERR_DATA_LOSS, "image_folder: '" + path + "' " + what);
}

// Up to `limit` bytes of `path` (all of it by default).
std::vector<uint8_t> read_file(const std::string& path, size_t limit = SIZE_MAX) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) data_loss(path, std::string("cannot be opened: ") + std::strerror(errno));
  std::vector<uint8_t> bytes;
  struct stat st {};
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    bytes.reserve(std::min(static_cast<size_t>(st.st_size), limit));
  }
  uint8_t chunk[65536];
  while (bytes.size() < limit) {
    const ssize_t n = read(fd, chunk, std::min(sizeof chunk, limit - bytes.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      close(fd);
      data_loss(path, std::string("cannot be read: ") + std::strerror(e));
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + n);
  }
  close(fd);
  return bytes;
}

enum class Format { jpeg, png, other };

Format sniff(const std::vector<uint8_t>& b) {
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return Format::jpeg;
  if (b.size() >= 8 && std::memcmp(b.data(), kPngSignature, 8) == 0) return Format::png;
  return Format::other;
}

uint32_t big_endian(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// IHDR, which the PNG format puts first: width, height, depth, colour type.
Header png_header(const std::vector<uint8_t>& b, const std::string& path) {
  if (b.size() < 33 || big_endian(&b[8]) != 13 || std::memcmp(&b[12], "IHDR", 4) != 0) {
    data_loss(path, "is not a readable PNG: no IHDR chunk after the signature");
  }
  Header h;
  h.width = big_endian(&b[16]);
  h.height = big_endian(&b[20]);
  const uint8_t colour_type = b[25];
  if (h.width == 0 || h.height == 0 || h.width > 0x7fffffff || h.height > 0x7fffffff) {
    data_loss(path, "is not a readable PNG: its IHDR gives a size of " + std::to_string(h.width) +
                        " x " + std::to_string(h.height));
  }
  h.channels = (colour_type == 0 || colour_type == 4) ? 1 : 3;  // gray, gray + alpha
  return h;
}

[[noreturn]] void not_an_image(const std::string& path) {
  data_loss(path, "is neither a JPEG nor a PNG file (by its first bytes)");
}

void check_capacity(const std::string& path, const Header& h, int channels, size_t capacity) {
  const uint64_t need = static_cast<uint64_t>(h.height) * static_cast<uint64_t>(h.width) *
                        static_cast<uint64_t>(channels);
  if (need > capacity) {
    throw Error(KILN_ERR_INVALID_ARGUMENT,
                "image_folder: decode of '" + path + "' needs " + std::to_string(h.height) + " x " +
                    std::to_string(h.width) + " x " + std::to_string(channels) +
                    " bytes; the buffer holds " + std::to_string(capacity));
  }
}

Decoded png_decode(const std::vector<uint8_t>& bytes, const std::string& path, int channels,
                   uint8_t* pixels, size_t capacity, uint64_t max_pixels) {
  const Header h = png_header(bytes, path);
  check_pixels(path, h.height, h.width, max_pixels);
  check_capacity(path, h, channels, capacity);
  kiln_png_image image;
  if (kiln_png_decode(bytes.data(), bytes.size(),
                      static_cast<uint64_t>(h.height) * static_cast<uint64_t>(h.width),
                      &image) != 0) {
    // Out of memory too: this image cannot be decoded here, and the loader skips or stops
    // with its path as for any unreadable one.
    data_loss(path, std::string("is not a readable PNG: ") + image.error + " (" +
                        std::to_string(h.width) + " x " + std::to_string(h.height) + ")");
  }
  const std::unique_ptr<uint8_t, decltype(&std::free)> owned(image.pixels, &std::free);
  if (image.width != h.width || image.height != h.height) {
    data_loss(path, "is not a readable PNG: its size changed while decoding");
  }
  static constexpr Layout kLayouts[] = {Layout::gray, Layout::gray_alpha, Layout::rgb,
                                        Layout::rgba};
  convert(image.pixels, kLayouts[image.channels - 1],
          static_cast<size_t>(h.height) * static_cast<size_t>(h.width), pixels, channels);
  Decoded out;
  out.height = h.height;
  out.width = h.width;
  return out;
}

}  // namespace

Header probe_image(const std::string& path) {
  std::vector<uint8_t> bytes = read_file(path, kProbeBytes);
  switch (sniff(bytes)) {
    case Format::png:
      return png_header(bytes, path);
    case Format::jpeg: {
      Header h;
      if (jpeg_header(bytes.data(), bytes.size(), path, &h)) return h;
      if (bytes.size() == kProbeBytes) {  // headers longer than the first read: read it all
        bytes = read_file(path);
        if (jpeg_header(bytes.data(), bytes.size(), path, &h)) return h;
      }
      data_loss(path, "is not a readable JPEG: its header cannot be parsed");
    }
    case Format::other:
      break;
  }
  not_an_image(path);
}

void check_pixels(const std::string& path, int64_t height, int64_t width, uint64_t max_pixels) {
  if (kiln_pixel_limit(static_cast<uint64_t>(height), static_cast<uint64_t>(width), max_pixels) !=
      KILN_PIXELS_REFUSE) {
    return;
  }
  const std::string size = std::to_string(width) + " x " + std::to_string(height);
  data_loss(path, "claims " + size + " pixels, more than twice data.max_image_pixels (" +
                      std::to_string(max_pixels) +
                      "): a decompression bomb? (raise data.max_image_pixels if the image is "
                      "genuine)");
}

Decoded decode_image(const std::string& path, int scale_denom, int channels, uint8_t* pixels,
                     size_t capacity, uint64_t max_pixels) {
  const std::vector<uint8_t> bytes = read_file(path);
  switch (sniff(bytes)) {
    case Format::jpeg:
      return jpeg_decode(bytes.data(), bytes.size(), path, scale_denom, channels, pixels, capacity,
                         max_pixels);
    case Format::png:
      return png_decode(bytes, path, channels, pixels, capacity, max_pixels);
    case Format::other:
      break;
  }
  not_an_image(path);
}

bool decodable_extension(const std::string& extension) {
  for (const char* e : {".jpg", ".jpeg", ".jpe", ".jfif", ".png"}) {
    if (extension == e) return true;
  }
  return false;
}

}  // namespace kiln::image_folder
