// One image file: its size from the header alone, and its pixels decoded into a host buffer.
// The format is told by the file's first bytes, as PIL tells it, not by the extension.
// Failures throw kiln::Error: KILN_ERR_DATA_LOSS naming the path for a file that cannot be read
// or decoded, KILN_ERR_INVALID_ARGUMENT for a request that cannot be met.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::image_folder {

struct Header {
  int64_t height = 0;
  int64_t width = 0;
  int channels = 0;  // 1 for a gray image, 3 for a colour one (PIL mode L vs the others)
};

struct Decoded {
  int64_t height = 0;
  int64_t width = 0;
  int scale = 1;  // the reduction d used
};

Header probe_image(const std::string& path);

// Throws KILN_ERR_DATA_LOSS naming `path` and the size its header claims when kiln_pixel_limit
// refuses it under `max_pixels` (0: no limit): a decompression bomb is refused before anything
// the size of its pixels is allocated.
void check_pixels(const std::string& path, int64_t height, int64_t width, uint64_t max_pixels);

// Decodes `path` into `pixels` (HWC, `channels` 1 or 3), reduced by the largest d in {1, 2, 4,
// 8} dividing `scale_denom` that the format offers (JPEG; PNG decodes at d = 1). Writes nothing
// when `capacity` is too small, or when the header's size fails check_pixels (checked first).
Decoded decode_image(const std::string& path, int scale_denom, int channels, uint8_t* pixels,
                     size_t capacity, uint64_t max_pixels);

// The extensions of the formats decoded (lower case, with the dot).
bool decodable_extension(const std::string& extension);

}  // namespace kiln::image_folder
