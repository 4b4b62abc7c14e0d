/*
 * kiln/dataset.h — the dataset component (since ABI 1.7): a source of labelled images. A plugin
 * reports how many samples and classes a split holds and decodes sample i into a buffer the host
 * provides; the host does everything else (sampling, sharding per rank, shuffling, transforms,
 * batching, pinning), in its loader threads. A dataset needs no LibTorch: plain C suffices.
 *
 * Images cross the boundary as uint8 pixels, height x width x channels, rows top to bottom,
 * channels interleaved (HWC, the layout JPEG and PNG decoders write), tightly packed.
 *
 * Targets: one class per sample (the label `probe` and `decode` report), or, since ABI 1.10, a
 * row of num_classes values per sample (multi-label data: any number of the classes at once),
 * which the optional `targets` slot writes.
 */
#ifndef KILN_DATASET_H_
#define KILN_DATASET_H_

#include "kiln/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which split an instance serves (int32_t). */
enum { KILN_SPLIT_TRAIN = 0, KILN_SPLIT_VAL = 1 };

/* What the host asks for when it creates an instance. */
typedef struct kiln_dataset_open {
  size_t struct_size; /* sizeof(kiln_dataset_open) as the host knows it */
  int32_t split;      /* KILN_SPLIT_* */
  int32_t reserved;   /* zero */
  /* The run's seed (run.seed), for datasets that generate or subsample their samples: the same
   * seed gives the same samples. */
  uint64_t seed;
  /* Since ABI 1.13 (read only when struct_size covers it; 0 from an older host): the
   * decompression-bomb limit, data.max_image_pixels (PIL's Image.MAX_IMAGE_PIXELS, 89,478,485
   * by default); 0 means no limit. A dataset that decodes compressed images reads each image's
   * size from its header before allocating anything, and refuses an image that
   * kiln_pixel_limit() below calls KILN_PIXELS_REFUSE (more than twice this many pixels) with
   * KILN_ERR_DATA_LOSS, naming the file and the size it claims; above the limit but not twice,
   * it decodes the image and may warn through host->log, as PIL does. The host holds every
   * size a plugin reports (info, probe, decode) to the same rule, so the limit binds a plugin
   * that does not read this field too; only the plugin can name the file. */
  uint64_t max_pixels;
} kiln_dataset_open;
#define KILN_DATASET_OPEN_V1_7_SIZE KILN_SIZE_UP_TO(kiln_dataset_open, seed)

/* What kiln_pixel_limit() says of an image's size (PIL's decompression-bomb rule). */
enum {
  KILN_PIXELS_WITHIN = 0, /* at most max_pixels, or no limit */
  KILN_PIXELS_WARN = 1,   /* above max_pixels, at most twice it: decoded, with a warning */
  /* above twice max_pixels, or height x width beyond 64 bits: refused before any allocation */
  KILN_PIXELS_REFUSE = 2
};

/* The rule for an image of height x width pixels under a limit of max_pixels (0: none); sizes
 * as a header claims them, checked for overflow before they are multiplied. */
static inline int kiln_pixel_limit(uint64_t height, uint64_t width, uint64_t max_pixels) {
  uint64_t pixels;
  if (width != 0 && height > UINT64_MAX / width) return KILN_PIXELS_REFUSE;
  pixels = height * width;
  if (max_pixels == 0 || pixels <= max_pixels) return KILN_PIXELS_WITHIN;
  if (max_pixels <= UINT64_MAX / 2 && pixels > 2 * max_pixels) return KILN_PIXELS_REFUSE;
  return KILN_PIXELS_WARN;
}

/* What each sample's target is (int32_t; kiln_dataset_info.target_kind, since ABI 1.10). */
enum {
  /* One class per sample: the `label` of probe and decode. What a dataset built for 1.7 to 1.9
   * reports (the host zeroes the field before `info`). */
  KILN_TARGET_CLASS = 0,
  /* A row of num_classes values in [0, 1] per sample, written by the `targets` slot: 1 for a
   * class the sample has, 0 for one it lacks, a value between for a soft target. The `label`
   * of probe and decode must still lie in [0, num_classes); the host does not use it. */
  KILN_TARGET_MULTI_LABEL = 1
};

/* What an instance holds; filled by `info`. */
typedef struct kiln_dataset_info {
  size_t struct_size;  /* sizeof(kiln_dataset_info) as the host knows it; the plugin writes only
                          the fields inside it */
  int64_t num_samples; /* > 0 */
  int64_t num_classes; /* > 0; every label is in [0, num_classes) */
  int32_t channels;    /* channels of every decoded sample (1: gray, 3: RGB, or any count > 0) */
  int32_t reserved;    /* zero */
  /* Every sample's size when they all share one (IDX, CIFAR, tensors); 0 and 0 when samples
   * differ (an image folder), and then `probe` gives each one's. */
  int64_t height;
  int64_t width;
  /* num_classes names (an image folder's sub-folder names), or NULL. Owned by the instance and
   * valid until `destroy`. */
  const char* const* class_names;
  /* Since ABI 1.10 (written only when struct_size covers it): KILN_TARGET_*. A dataset of
   * KILN_TARGET_MULTI_LABEL refuses, at `create`, a host older than 1.10 (kiln_host_api's
   * abi_minor), which would train on its labels alone. */
  int32_t target_kind;
  int32_t reserved2; /* zero */
} kiln_dataset_info;
#define KILN_DATASET_INFO_V1_7_SIZE KILN_SIZE_UP_TO(kiln_dataset_info, class_names)

/* One sample's size at full scale and its label; filled by `probe`. */
typedef struct kiln_sample_header {
  size_t struct_size; /* sizeof(kiln_sample_header) as the host knows it */
  int64_t height;     /* > 0 */
  int64_t width;      /* > 0 */
  int64_t label;      /* in [0, num_classes) */
} kiln_sample_header;

/* Where and how to decode one sample. */
typedef struct kiln_decode_request {
  size_t struct_size; /* sizeof(kiln_decode_request) as the host knows it */
  /* 1, 2, 4 or 8: the host accepts the image reduced by any factor d that divides scale_denom
   * (JPEG's DCT-domain scaling decodes 1/2, 1/4, 1/8 far faster), each side then being
   * ceil(full / d). A plugin that cannot reduce decodes at full scale (d = 1). */
  int32_t scale_denom;
  int32_t reserved; /* zero */
  /* Host-owned memory for height x width x channels bytes (HWC) at the scale chosen; valid for
   * the call. At full scale the header's size x channels always fits. */
  uint8_t* pixels;
  size_t capacity; /* bytes at `pixels` */
} kiln_decode_request;

/* What `decode` wrote. */
typedef struct kiln_decoded_sample {
  size_t struct_size; /* sizeof(kiln_decoded_sample) as the host knows it */
  int64_t height;     /* rows written */
  int64_t width;      /* columns written */
  int64_t label;      /* as `probe` reports */
  int32_t scale;      /* the factor d used (1 at full scale) */
  int32_t reserved;   /* zero */
} kiln_decoded_sample;

/* The dataset vtable (kiln_component_descriptor.vtable for KILN_COMPONENT_DATASET).
 *
 * Errors: a sample that cannot be read (a missing, truncated or corrupt file) is reported with
 * KILN_ERR_DATA_LOSS and a message naming the file (and the record, where one file holds
 * many); the host then skips the sample or stops, as the pipeline says. Errors of `create` (a
 * missing root, an empty class folder) use KILN_ERR_INVALID_ARGUMENT and name the option and
 * the path: the host reports them as configuration errors, before the run.
 *
 * Breaking the contract refuses the plugin (the CLI exits 3, as for a library that does not
 * load), whenever the host finds it: an `info` with no samples, classes or channels, a size
 * whose bytes overflow, a non-zero reserved field, an unknown target kind, multi-label without
 * `targets`; a `probe` of a size <= 0 or a label out of range; a `decode` that reports more
 * than the buffer holds, a label out of range, or another size than `probe` (or a fixed-size
 * `info`) reported, reduced by its scale; a target outside [0, 1]. A size over the pixel limit
 * (kiln_dataset_open.max_pixels) is not a breach: it is the sample's fault, skipped or stopped
 * at as the pipeline says. */
typedef struct kiln_dataset_vtable {
  size_t struct_size; /* sizeof(kiln_dataset_vtable) as the plugin knows it */

  /* Required. Opens `open->split` as the validated `options` say (all borrowed for the call).
   * `*out` receives plugin-owned state, released by `destroy`. May read the whole index (list
   * a folder, read a file's header); should not decode every sample. */
  KILN_MUST_USE_SLOT kiln_status* (*create)(const kiln_host_api* host, const kiln_options* options,
                                            const kiln_dataset_open* open, void** out);

  /* Required. Releases an instance. NULL is ignored. */
  void (*destroy)(void* instance);

  /* Required. Fills `*out` (host-owned). Thread-safe; the same answer every call. */
  KILN_MUST_USE_SLOT kiln_status* (*info)(void* instance, kiln_dataset_info* out);

  /* Required. Size and label of sample `index` (0 <= index < num_samples) without decoding its
   * pixels (an image file's header at most). Thread-safe: loader threads call it at once. */
  KILN_MUST_USE_SLOT kiln_status* (*probe)(void* instance, int64_t index, kiln_sample_header* out);

  /* Required. Decodes sample `index` into `request->pixels` (HWC, channels as `info` says, gray
   * images expanded or colour images converted as the plugin's options say) and fills `*out`.
   * Fails with KILN_ERR_INVALID_ARGUMENT, writing nothing, when the capacity is too small.
   * Thread-safe: loader threads call it at once, for different or equal indices. */
  KILN_MUST_USE_SLOT kiln_status* (*decode)(void* instance, int64_t index,
                                            const kiln_decode_request* request,
                                            kiln_decoded_sample* out);

  /* Since ABI 1.10; required when `info` reports KILN_TARGET_MULTI_LABEL, else NULL (the host
   * reads it only when struct_size covers it). Writes sample `index`'s target row: `count`
   * (= num_classes) floats at `out`, host-owned and valid for the call, each in [0, 1]. Fails
   * as `decode` does (KILN_ERR_DATA_LOSS for unreadable data). Thread-safe: loader threads call
   * it at once. */
  KILN_MUST_USE_SLOT kiln_status* (*targets)(void* instance, int64_t index, float* out,
                                             int64_t count);

  /* Since ABI 1.13; optional (NULL, or outside struct_size: the host writes "sample <index>").
   * Writes what names sample `index` to a person reading an error message — its file's path,
   * or "<file>: record <r>" where one file holds many — NUL-terminated into `out` (host-owned,
   * `capacity` > 0 bytes, valid for the call), cut short to fit. The host calls it only to
   * write a message: when two samples differ in size, when a sample breaks the contract, when
   * one is over the pixel limit. Thread-safe. */
  KILN_MUST_USE_SLOT kiln_status* (*sample_name)(void* instance, int64_t index, char* out,
                                                 size_t capacity);
} kiln_dataset_vtable;

/* The vtable with every slot named: KILN_DATASET_VTABLE_INIT(create, destroy, info, probe,
 * decode) (one class per sample), KILN_DATASET_VTABLE_TARGETS_INIT(create, destroy, info,
 * probe, decode, targets) (multi-label, ABI 1.10), KILN_DATASET_VTABLE_NAMED_INIT(create,
 * destroy, info, probe, decode, targets, sample_name) (samples named in messages, ABI 1.13;
 * targets may be NULL). */
#define KILN_DATASET_VTABLE_INIT(create_, destroy_, info_, probe_, decode_) \
  KILN_DATASET_VTABLE_TARGETS_INIT(create_, destroy_, info_, probe_, decode_, NULL)
#define KILN_DATASET_VTABLE_TARGETS_INIT(create_, destroy_, info_, probe_, decode_, targets_) \
  KILN_DATASET_VTABLE_NAMED_INIT(create_, destroy_, info_, probe_, decode_, targets_, NULL)
#define KILN_DATASET_VTABLE_NAMED_INIT(create_, destroy_, info_, probe_, decode_, targets_,    \
                                       sample_name_)                                           \
  {                                                                                            \
    KILN_FIELD_(struct_size)                                                                   \
    sizeof(kiln_dataset_vtable), KILN_FIELD_(create)(create_), KILN_FIELD_(destroy)(destroy_), \
        KILN_FIELD_(info)(info_), KILN_FIELD_(probe)(probe_), KILN_FIELD_(decode)(decode_),    \
        KILN_FIELD_(targets)(targets_), KILN_FIELD_(sample_name)(sample_name_)                 \
  }
#define KILN_DATASET_VTABLE_V1_SIZE KILN_SIZE_UP_TO(kiln_dataset_vtable, decode)
#define KILN_DATASET_VTABLE_V1_10_SIZE KILN_SIZE_UP_TO(kiln_dataset_vtable, targets)
#define KILN_DATASET_VTABLE_V1_13_SIZE KILN_SIZE_UP_TO(kiln_dataset_vtable, sample_name)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_DATASET_H_ */
