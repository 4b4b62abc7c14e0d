/* A dataset in plain C99 that never sees LibTorch: procedural gradients of a few classes, each
 * sample its own size, with reduced decoding (scale_denom) and a sample that can be made to fail
 * (fail_index: KILN_ERR_DATA_LOSS). The expected pixels are gradient_value() below; the tests
 * compute the same.
 *
 * Sample i: label i % classes, height 8 + 4 * (i % 5), width 6 + 5 * (i % 3); the full-scale
 * pixel (y, x, c) is (7 y + 3 x + 50 c + 11 i + 40 label) mod 256. Reduced by d, pixel (y, x) is
 * the full-scale pixel (d y, d x), and each side is ceil(full / d).
 *
 * With multi_label (ABI 1.10), sample i has class k when bit k of (i + 1) is set (every sample
 * at least one class), its target row 1 there and 0 elsewhere; bad_target makes sample
 * bad_target's row hold 2 (outside [0, 1]), for the host's refusal. Built against headers
 * older than 1.10 (tests/sdk/frozen/v1.9) it has neither option.
 *
 * Since ABI 1.13 each sample is named "gradients.bin: record <i>" (the sample_name slot), and
 * options make it misbehave for the host's checks, ignoring kiln_dataset_open.max_pixels as an
 * older plugin would: bomb_index, a sample whose probe claims 65000 x 65000; breach, one way of
 * breaking the contract (huge_info: every sample 2^40 x 2^40; negative_samples; zero_channels;
 * decode_size: sample 1 decodes a row short of what probe reports). */
#include <stdio.h>
#include <stdlib.h>

#include "kiln/dataset.h"
#include "kiln/plugin.h"

typedef struct gradients {
  const kiln_host_api* host; /* makes the statuses of the slots that do not receive it */
  int64_t samples;
  int64_t classes;
  int32_t channels;
  int64_t fail_index; /* -1: none */
  int multi_label;
  int64_t bad_target; /* -1: none */
  int64_t bomb_index; /* -1: none */
  char breach[24];    /* "none" or how the contract is broken */
} gradients;

#ifdef KILN_DATASET_VTABLE_V1_10_SIZE
#define WITH_TARGETS 1
#endif
#ifdef KILN_DATASET_VTABLE_V1_13_SIZE
#include <string.h>
#define WITH_NAMES 1
#endif

static const char* const class_names[] = {"red", "green", "blue", "cyan", "magenta", "yellow"};

static int64_t sample_height(int64_t i) { return 8 + 4 * (i % 5); }
static int64_t sample_width(int64_t i) { return 6 + 5 * (i % 3); }

static kiln_status* invalid(const kiln_host_api* host, const char* message) {
  return host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
}

static kiln_status* gradients_create(const kiln_host_api* host, const kiln_options* options,
                                     const kiln_dataset_open* open, void** out) {
  gradients* g;
  if (open->split != KILN_SPLIT_TRAIN && open->split != KILN_SPLIT_VAL) {
    return invalid(host, "gradients: unknown split");
  }
  g = (gradients*)malloc(sizeof *g);
  if (g == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "gradients: out of memory");
  g->host = host;
  g->samples = kiln_options_int(options, "samples", 24);
  /* The validation split is a third of the training one. */
  if (open->split == KILN_SPLIT_VAL) g->samples = g->samples / 3 > 0 ? g->samples / 3 : 1;
  g->classes = kiln_options_int(options, "classes", 3);
  g->channels = (int32_t)kiln_options_int(options, "channels", 3);
  g->fail_index = kiln_options_int(options, "fail_index", -1);
  g->multi_label = 0;
  g->bad_target = -1;
  g->bomb_index = -1;
  g->breach[0] = '\0';
#ifdef WITH_NAMES
  g->bomb_index = kiln_options_int(options, "bomb_index", -1);
  strncpy(g->breach, kiln_options_string(options, "breach", "none"), sizeof g->breach - 1);
  g->breach[sizeof g->breach - 1] = '\0';
#endif
#ifdef WITH_TARGETS
  g->multi_label = kiln_options_bool(options, "multi_label", 0);
  g->bad_target = kiln_options_int(options, "bad_target", -1);
  /* An older host would train on the labels alone. */
  if (g->multi_label && host->abi_minor < 10) {
    free(g);
    return invalid(host, "gradients: multi_label needs a host of ABI 1.10 or later");
  }
#endif
  *out = g;
  return NULL;
}

static void gradients_destroy(void* instance) { free(instance); }

static kiln_status* gradients_info(void* instance, kiln_dataset_info* out) {
  const gradients* g = (const gradients*)instance;
  out->num_samples = g->samples;
  out->num_classes = g->classes;
  out->channels = g->channels;
  out->reserved = 0;
  out->height = 0; /* sizes differ: probe gives each one's */
  out->width = 0;
  out->class_names = class_names;
#ifdef WITH_NAMES
  if (strcmp(g->breach, "huge_info") == 0) out->height = out->width = (int64_t)1 << 40;
  if (strcmp(g->breach, "negative_samples") == 0) out->num_samples = -g->samples;
  if (strcmp(g->breach, "zero_channels") == 0) out->channels = 0;
#endif
#ifdef WITH_TARGETS
  if (KILN_HAS_FIELD(out, kiln_dataset_info, reserved2)) {
    out->target_kind = g->multi_label ? KILN_TARGET_MULTI_LABEL : KILN_TARGET_CLASS;
    out->reserved2 = 0;
  }
#endif
  return NULL;
}

static kiln_status* check_index(const gradients* g, int64_t index) {
  char message[96];
  if (index >= 0 && index < g->samples) return NULL;
  snprintf(message, sizeof message, "gradients: sample %lld outside [0, %lld)", (long long)index,
           (long long)g->samples);
  return invalid(g->host, message);
}

static kiln_status* gradients_probe(void* instance, int64_t index, kiln_sample_header* out) {
  const gradients* g = (const gradients*)instance;
  kiln_status* status = check_index(g, index);
  if (status != NULL) return status;
  out->height = sample_height(index);
  out->width = sample_width(index);
  out->label = index % g->classes;
  return NULL;
}

#if defined(MISSING_SLOT) && defined(__GNUC__)
__attribute__((unused))
#endif
static kiln_status*
gradients_decode(void* instance, int64_t index, const kiln_decode_request* request,
                 kiln_decoded_sample* out) {
  const gradients* g = (const gradients*)instance;
  int64_t d = request->scale_denom >= 1 ? request->scale_denom : 1;
  int64_t height, width, y, x, c;
  const int64_t label = index % g->classes;
  char message[160];
  kiln_status* status = check_index(g, index);
  if (status != NULL) return status;
  if (index == g->fail_index) {
    snprintf(message, sizeof message, "gradients.bin: record %lld: checksum mismatch",
             (long long)index);
    return g->host->make_status(KILN_ERR_DATA_LOSS, message);
  }
  height = (sample_height(index) + d - 1) / d;
  width = (sample_width(index) + d - 1) / d;
  if (request->pixels == NULL || request->capacity < (size_t)(height * width * g->channels)) {
    return invalid(g->host, "gradients: the buffer is too small");
  }
  for (y = 0; y < height; ++y) {
    for (x = 0; x < width; ++x) {
      for (c = 0; c < g->channels; ++c) {
        request->pixels[(y * width + x) * g->channels + c] =
            (uint8_t)((7 * d * y + 3 * d * x + 50 * c + 11 * index + 40 * label) % 256);
      }
    }
  }
  out->height = height;
  out->width = width;
  out->label = label;
  out->scale = (int32_t)d;
  out->reserved = 0;
  return NULL;
}

#ifdef WITH_TARGETS
#if (defined(MISSING_SLOT) || defined(NO_TARGETS_SLOT)) && defined(__GNUC__)
__attribute__((unused))
#endif
static kiln_status*
gradients_targets(void* instance, int64_t index, float* out, int64_t count) {
  const gradients* g = (const gradients*)instance;
  int64_t k;
  kiln_status* status = check_index(g, index);
  if (status != NULL) return status;
  if (!g->multi_label) return invalid(g->host, "gradients: targets without multi_label");
  if (out == NULL || count != g->classes) return invalid(g->host, "gradients: targets row");
  for (k = 0; k < count; ++k) out[k] = (float)(((index + 1) >> k) & 1);
  if (index == g->bad_target) out[0] = 2.0F;
  return NULL;
}
#endif

#ifdef WITH_NAMES
#if (defined(MISSING_SLOT) || defined(NO_TARGETS_SLOT)) && defined(__GNUC__)
#define UNUSED_SLOT __attribute__((unused))
#else
#define UNUSED_SLOT
#endif
UNUSED_SLOT static kiln_status* gradients_sample_name(void* instance, int64_t index, char* out,
                                                      size_t capacity) {
  const gradients* g = (const gradients*)instance;
  kiln_status* status = check_index(g, index);
  if (status != NULL) return status;
  snprintf(out, capacity, "gradients.bin: record %lld", (long long)index);
  return NULL;
}

/* probe and decode as above, misbehaving where bomb_index and breach say (for the host's
 * checks; a real dataset has no use for them). */
UNUSED_SLOT static kiln_status* misbehaving_probe(void* instance, int64_t index,
                                                  kiln_sample_header* out) {
  const gradients* g = (const gradients*)instance;
  kiln_status* status = gradients_probe(instance, index, out);
  if (status == NULL && index == g->bomb_index) out->height = out->width = 65000;
  return status;
}

UNUSED_SLOT static kiln_status* misbehaving_decode(void* instance, int64_t index,
                                                   const kiln_decode_request* request,
                                                   kiln_decoded_sample* out) {
  const gradients* g = (const gradients*)instance;
  kiln_status* status = gradients_decode(instance, index, request, out);
  if (status == NULL && index == 1 && strcmp(g->breach, "decode_size") == 0) --out->height;
  return status;
}
#endif

static const kiln_option_spec options[] = {
    KILN_OPTION_MIN_INIT("samples", KILN_OPT_INT, 1.0, "24", "training samples"),
    KILN_OPTION_RANGE_INIT("classes", KILN_OPT_INT, 1.0, 6.0, "3", "classes"),
    KILN_OPTION_RANGE_INIT("channels", KILN_OPT_INT, 1.0, 4.0, "3", "channels"),
    KILN_OPTION_INIT("fail_index", KILN_OPT_INT, "-1", "a sample whose decode fails (-1: none)"),
#ifdef WITH_TARGETS
    KILN_OPTION_INIT("multi_label", KILN_OPT_BOOL, "false", "classes by the bits of index + 1"),
    KILN_OPTION_INIT("bad_target", KILN_OPT_INT, "-1", "a sample whose target row holds 2"),
#endif
#ifdef WITH_NAMES
    KILN_OPTION_INIT("bomb_index", KILN_OPT_INT, "-1",
                     "a sample whose probe claims 65000 x 65000 (-1: none)"),
    KILN_OPTION_CHOICES_INIT("breach", "none,huge_info,negative_samples,zero_channels,decode_size",
                             "\"none\"", "how the dataset breaks its contract"),
#endif
};

#if !defined(MISSING_SLOT) && !defined(NO_TARGETS_SLOT) && defined(WITH_NAMES)
static const kiln_dataset_vtable vtable = KILN_DATASET_VTABLE_NAMED_INIT(
    gradients_create, gradients_destroy, gradients_info, misbehaving_probe, misbehaving_decode,
    gradients_targets, gradients_sample_name);
#define COMPONENT_NAME "gradients"
#define LIBRARY_NAME "good-c-dataset"
#elif !defined(MISSING_SLOT) && !defined(NO_TARGETS_SLOT) && defined(WITH_TARGETS)
/* Built against the headers of 1.10 to 1.12. */
static const kiln_dataset_vtable vtable =
    KILN_DATASET_VTABLE_TARGETS_INIT(gradients_create, gradients_destroy, gradients_info,
                                     gradients_probe, gradients_decode, gradients_targets);
#define COMPONENT_NAME "gradients"
#define LIBRARY_NAME "good-c-dataset"
#elif defined(NO_TARGETS_SLOT)
/* bad_dataset_no_targets: multi_label reported without the targets slot. */
static const kiln_dataset_vtable vtable = KILN_DATASET_VTABLE_INIT(
    gradients_create, gradients_destroy, gradients_info, gradients_probe, gradients_decode);
#define COMPONENT_NAME "gradients_without_targets"
#define LIBRARY_NAME "bad-dataset-no-targets"
#elif !defined(MISSING_SLOT)
/* Built against headers of 1.7 to 1.9: the five slots of then. */
static const kiln_dataset_vtable vtable = KILN_DATASET_VTABLE_INIT(
    gradients_create, gradients_destroy, gradients_info, gradients_probe, gradients_decode);
#define COMPONENT_NAME "gradients"
#define LIBRARY_NAME "good-c-dataset"
#else
/* bad_dataset_missing_slot: decode is required. */
static const kiln_dataset_vtable vtable = KILN_DATASET_VTABLE_INIT(
    gradients_create, gradients_destroy, gradients_info, gradients_probe, NULL);
#define COMPONENT_NAME "gradients_without_decode"
#define LIBRARY_NAME "bad-dataset-missing-slot"
#endif
static const kiln_capabilities caps = KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU);
static const kiln_component_descriptor component =
    KILN_COMPONENT_OPTIONS_INIT(KILN_COMPONENT_DATASET, COMPONENT_NAME, KILN_VERSION_INIT(1, 0, 0),
                                "procedural gradients of variable size", &caps, options, &vtable);
static const kiln_component_descriptor* const components[] = {&component};

#ifndef OLD_MINOR
static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT(LIBRARY_NAME, KILN_VERSION_INIT(1, 0, 0), components, NULL);
KILN_DEFINE_PLUGIN_PROBE()
#else
/* bad_dataset_old_minor: a dataset in a library that says it was built for ABI 1.6, before the
 * kind existed. */
static const kiln_plugin_descriptor descriptor = {sizeof(kiln_plugin_descriptor),
                                                  KILN_ABI_MAJOR,
                                                  6,
                                                  "bad-dataset-old-minor",
                                                  KILN_VERSION_INIT(1, 0, 0),
                                                  KILN_COUNT(components),
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};
KILN_EXPORT uint32_t kiln_plugin_abi(void) { return KILN_ABI_PACK(KILN_ABI_MAJOR, 6); }
#endif

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
