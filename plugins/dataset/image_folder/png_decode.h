/* PNG decoding with libpng, in C: libpng reports errors by longjmp, which must not cross C++
 * frames (their destructors would be skipped). */
#ifndef KILN_IMAGE_FOLDER_PNG_DECODE_H_
#define KILN_IMAGE_FOLDER_PNG_DECODE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_png_image {
  uint32_t width;
  uint32_t height;
  int channels;    /* 1 gray, 2 gray + alpha, 3 RGB, 4 RGBA; 8 bits each */
  uint8_t* pixels; /* malloc'ed height x width x channels; the caller frees it */
  char error[200]; /* libpng's message when decoding fails */
} kiln_png_image;

/* Decodes the PNG file held in `data` (size bytes) to 8 bits per channel: palettes expanded to
 * RGB, gray below 8 bits to 8, tRNS to alpha, 16 bits to their high byte (PIL's "RGB;16B").
 * `max_pixels` caps width x height before anything is allocated. 0 on success; -1 with
 * `out->error` set (and no pixels) otherwise. */
int kiln_png_decode(const uint8_t* data, size_t size, uint64_t max_pixels, kiln_png_image* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_IMAGE_FOLDER_PNG_DECODE_H_ */
