// JPEG through libjpeg-turbo's TurboJPEG API: default (accurate, "islow") DCT and fancy
// upsampling, as PIL decodes, and DCT-domain scaling (1/2, 1/4, 1/8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "image.hpp"

namespace kiln::image_folder {

// The size and channels from the header in `data` (its first bytes at least). false when the
// header is not complete in `data` (more of the file is needed); throws DATA_LOSS when corrupt.
bool jpeg_header(const uint8_t* data, size_t size, const std::string& path, Header* out);

// Decodes as decode_image does, the header's size held to check_pixels first.
Decoded jpeg_decode(const uint8_t* data, size_t size, const std::string& path, int scale_denom,
                    int channels, uint8_t* pixels, size_t capacity, uint64_t max_pixels);

}  // namespace kiln::image_folder
