/*
 * amp.h — what the files of kiln_amp share: the flavours (which policy a component declares and
 * which of its knobs come from options), the settings read from a component's options, the
 * instance behind every component, and the components themselves. Internal to the library (the
 * version script keeps these symbols local).
 */
#ifndef KILN_PLUGINS_AMP_AMP_H_
#define KILN_PLUGINS_AMP_AMP_H_

#include "kiln/plugin.h"
#include "kiln/precision.h"
#include "scaler.h"

/* How a component uses the half dtype. */
typedef enum kiln_amp_mode {
  KILN_AMP_AUTOCAST = 0, /* fp32 model, forward under autocast (apex O1, torch.amp) */
  KILN_AMP_MASTER = 1,   /* half model, fp32 master weights (apex O2) */
  KILN_AMP_PURE = 2      /* half model, half optimizer state (apex O3) */
} kiln_amp_mode;

/* What a component is: its name (for messages), its mode, and the knobs its option table does
 * not offer. */
typedef struct kiln_amp_flavour {
  const char* name;
  kiln_amp_mode mode;
  int32_t fixed_dtype; /* KILN_DTYPE_F16 / BF16; 0: read the `dtype` option */
  int has_norm_option; /* `keep_norm_fp32` exists (otherwise norms stay fp32) */
  int has_scaling;     /* the loss-scaling options exist (otherwise no scaling) */
} kiln_amp_flavour;

/* A component's options, read and checked. */
typedef struct kiln_amp_settings {
  int32_t half_dtype; /* KILN_DTYPE_F16 or KILN_DTYPE_BF16 */
  int norm_fp32;
  int32_t loss_scaling; /* KILN_SCALE_* */
  double init_scale;    /* the first (or static) scale; 1 without scaling */
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  int64_t hysteresis;
  double min_scale;
  double max_scale;
  int32_t at_min_scale; /* KILN_AT_MIN_SCALE_* */
} kiln_amp_settings;

/* Reads `options` per `flavour` for an instance on `device`; a status naming the component and
 * the offending values when they are unusable. */
kiln_status* kiln_amp_read_settings(const kiln_host_api* host, const kiln_amp_flavour* flavour,
                                    const kiln_options* options, DLDevice device,
                                    kiln_amp_settings* out);

/* The vtable slots every component shares; create is per component (it binds the flavour). */
kiln_status* kiln_amp_create(const kiln_amp_flavour* flavour, const kiln_host_api* host,
                             const kiln_options* options, DLDevice device, void** out);
void kiln_amp_destroy(void* instance);
kiln_status* kiln_amp_policy(void* instance, kiln_precision_policy* policy);
kiln_status* kiln_amp_update_scale(void* instance, int32_t grads_finite, double* scale);
/* The scale rule's counters (growth tracker, hysteresis left) for checkpoints. */
kiln_status* kiln_amp_get_state(void* instance, double* values, size_t capacity, size_t* count);
kiln_status* kiln_amp_set_state(void* instance, const double* values, size_t count);

/* The components (components.c): the policies, then their apex and Lightning aliases. */
extern const kiln_component_descriptor kiln_amp_amp_component;        /* amp */
extern const kiln_component_descriptor kiln_amp_bf16_component;       /* bf16 */
extern const kiln_component_descriptor kiln_amp_o2_component;         /* o2 */
extern const kiln_component_descriptor kiln_amp_o3_component;         /* o3 */
extern const kiln_component_descriptor kiln_amp_o1_component;         /* O1 -> amp */
extern const kiln_component_descriptor kiln_amp_fp16_mixed_component; /* 16-mixed -> amp fp16 */
extern const kiln_component_descriptor kiln_amp_bf16_mixed_component; /* bf16-mixed -> bf16 */
extern const kiln_component_descriptor kiln_amp_o2_upper_component;   /* O2 -> o2 */
extern const kiln_component_descriptor kiln_amp_o3_upper_component;   /* O3 -> o3 */
extern const kiln_component_descriptor kiln_amp_fp16_true_component;  /* 16-true -> o3 fp16 */
extern const kiln_component_descriptor kiln_amp_bf16_true_component;  /* bf16-true -> o3 bf16 */

#endif /* KILN_PLUGINS_AMP_AMP_H_ */
