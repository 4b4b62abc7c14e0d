/* See png_decode.h. */
#include <png.h>
#include <stdlib.h>
#include <string.h>

#include "png_decode.h"

typedef struct reader {
  const uint8_t* data;
  size_t size;
  size_t at;
  kiln_png_image* out;
} reader;

static void on_error(png_structp png, png_const_charp message) {
  reader* r = (reader*)png_get_error_ptr(png);
  strncpy(r->out->error, message, sizeof r->out->error - 1);
  r->out->error[sizeof r->out->error - 1] = '\0';
  png_longjmp(png, 1);
}

/* Warnings (a bad ancillary chunk, an odd profile) do not stop PIL either. */
static void on_warning(png_structp png, png_const_charp message) {
  (void)png;
  (void)message;
}

static void read_bytes(png_structp png, png_bytep into, size_t length) {
  reader* r = (reader*)png_get_io_ptr(png);
  if (length > r->size - r->at) png_error(png, "the file ends early (truncated)");
  memcpy(into, r->data + r->at, length);
  r->at += length;
}

int kiln_png_decode(const uint8_t* data, size_t size, uint64_t max_pixels, kiln_png_image* out) {
  reader r = {data, size, 0, out};
  png_structp png = NULL;
  png_infop info = NULL;
  /* volatile: set after setjmp and read after a longjmp back to it. */
  uint8_t* volatile pixels = NULL;
  png_bytep* volatile rows = NULL;
  memset(out, 0, sizeof *out);
  png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, on_error, on_warning);
  if (png == NULL) {
    strcpy(out->error, "out of memory");
    return -1;
  }
  info = png_create_info_struct(png);
  if (info == NULL) {
    png_destroy_read_struct(&png, NULL, NULL);
    strcpy(out->error, "out of memory");
    return -1;
  }
  if (setjmp(png_jmpbuf(png))) {
    free(pixels);
    free(rows);
    png_destroy_read_struct(&png, &info, NULL);
    return -1;
  }
  png_set_read_fn(png, &r, read_bytes);
  png_read_info(png, info);
  png_set_expand(png);
  png_set_strip_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  {
    const png_uint_32 width = png_get_image_width(png, info);
    const png_uint_32 height = png_get_image_height(png, info);
    const int channels = png_get_channels(png, info);
    const size_t row_bytes = png_get_rowbytes(png, info);
    png_uint_32 y;
    if ((uint64_t)width * height > max_pixels) png_error(png, "the image is too large");
    if (png_get_bit_depth(png, info) != 8 || channels < 1 || channels > 4 ||
        row_bytes != (size_t)width * (size_t)channels) {
      png_error(png, "unexpected layout after conversion to 8 bits");
    }
    pixels = (uint8_t*)malloc(row_bytes * height);
    rows = (png_bytep*)malloc(sizeof(png_bytep) * height);
    if (pixels == NULL || rows == NULL) png_error(png, "out of memory");
    for (y = 0; y < height; ++y) rows[y] = pixels + (size_t)y * row_bytes;
    png_read_image(png, rows);
    out->width = width;
    out->height = height;
    out->channels = channels;
  }
  /* The rest of the file (text chunks, IEND) is not read: PIL stops after the pixels too. */
  free(rows);
  png_destroy_read_struct(&png, &info, NULL);
  out->pixels = pixels;
  return 0;
}
