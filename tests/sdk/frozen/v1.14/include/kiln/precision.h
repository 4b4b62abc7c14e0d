/*
 * kiln/precision.h — the precision component. A precision plugin declares a policy (dtypes,
 * autocast, master weights, loss scaling) and owns the loss-scale update rule; the host does the
 * mechanics (casting, autocast, unscaling, overflow checks).
 */
#ifndef KILN_PRECISION_H_
#define KILN_PRECISION_H_

#include "kiln/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Floating dtypes named by policies (int32_t). */
enum { KILN_DTYPE_F32 = 1, KILN_DTYPE_F16 = 2, KILN_DTYPE_BF16 = 3 };

/* Loss-scaling modes (int32_t). */
enum { KILN_SCALE_NONE = 0, KILN_SCALE_STATIC = 1, KILN_SCALE_DYNAMIC = 2 };

/* What the host does when gradients overflow while the scale is already at its minimum (int32_t,
 * since ABI 1.1). Either way it is logged; the scale never silently collapses below min_scale. */
enum {
  KILN_AT_MIN_SCALE_SKIP = 0, /* skip the step, warn, keep training at the minimum scale */
  KILN_AT_MIN_SCALE_STOP = 1  /* stop the run cleanly (weights saved) with a message */
};

/* The policy a precision instance declares (filled by the plugin). */
typedef struct kiln_precision_policy {
  size_t struct_size;     /* set by the host to the size it knows; the plugin fills up to it */
  int32_t model_dtype;    /* KILN_DTYPE_* the model's parameters are stored in */
  int32_t autocast;       /* nonzero: run forward under autocast to `compute_dtype` */
  int32_t compute_dtype;  /* KILN_DTYPE_* for autocast regions */
  int32_t master_weights; /* nonzero: the optimizer updates fp32 master copies */
  int32_t norm_fp32;      /* nonzero: keep norm layers in fp32 when model_dtype is half */
  int32_t loss_scaling;   /* KILN_SCALE_* */
  double initial_scale;   /* first loss scale (1.0 without scaling) */
  /* Since ABI 1.1. The host presets them (min_scale 1.0, at_min_scale KILN_AT_MIN_SCALE_STOP)
   * before calling `policy`, so a 1.0 plugin that leaves them alone gets those. */
  double min_scale;     /* the smallest scale the update rule produces; an overflow at or below
                           it triggers at_min_scale */
  int32_t at_min_scale; /* KILN_AT_MIN_SCALE_* */
} kiln_precision_policy;

/* sizeof(kiln_precision_policy) as ABI 1.0 knew it. */
#define KILN_PRECISION_POLICY_V1_0_SIZE KILN_SIZE_UP_TO(kiln_precision_policy, initial_scale)

/* The precision vtable (kiln_component_descriptor.vtable for KILN_COMPONENT_PRECISION). */
typedef struct kiln_precision_vtable {
  size_t struct_size; /* sizeof(kiln_precision_vtable) as the plugin knows it */

  /* Required. Creates an instance for `device` from validated options (borrowed). */
  KILN_MUST_USE_SLOT kiln_status* (*create)(const kiln_host_api* host, const kiln_options* options,
                                            DLDevice device, void** out);

  /* Required. Releases an instance. NULL is ignored. */
  void (*destroy)(void* instance);

  /* Required. Fills `*policy` (its struct_size set by the host). */
  KILN_MUST_USE_SLOT kiln_status* (*policy)(void* instance, kiln_precision_policy* policy);

  /* Optional (NULL: the scale never changes). Given whether the step's gradients were all
   * finite, updates `*scale` in place: the plugin owns the rule (growth, backoff, hysteresis,
   * bounds) and any counters it needs. Called exactly once per optimizer step (never per
   * micro-batch), from the training thread, before the next step's forward. */
  KILN_MUST_USE_SLOT kiln_status* (*update_scale)(void* instance, int32_t grads_finite,
                                                  double* scale);

  /* Since ABI 1.1. Optional (NULL: the rule keeps no state beyond the scale, which the host
   * saves itself). The rule's counters as numbers, for checkpoints: get_state writes up to
   * `capacity` values to `values` (host-owned) and sets `*count` to how many there are (call
   * with capacity 0 to ask); set_state restores what get_state wrote (borrowed `values`). */
  KILN_MUST_USE_SLOT kiln_status* (*get_state)(void* instance, double* values, size_t capacity,
                                               size_t* count);
  KILN_MUST_USE_SLOT kiln_status* (*set_state)(void* instance, const double* values, size_t count);
} kiln_precision_vtable;

/* The vtable with every slot named: KILN_PRECISION_VTABLE_INIT(create, destroy, policy,
 * update_scale, get_state, set_state). Optional slots may be NULL. */
#define KILN_PRECISION_VTABLE_INIT(create_, destroy_, policy_, update_scale_, get_state_,        \
                                   set_state_)                                                   \
  {                                                                                              \
    KILN_FIELD_(struct_size)                                                                     \
    sizeof(kiln_precision_vtable), KILN_FIELD_(create)(create_), KILN_FIELD_(destroy)(destroy_), \
        KILN_FIELD_(policy)(policy_), KILN_FIELD_(update_scale)(update_scale_),                  \
        KILN_FIELD_(get_state)(get_state_), KILN_FIELD_(set_state)(set_state_)                   \
  }
#define KILN_PRECISION_VTABLE_V1_SIZE KILN_SIZE_UP_TO(kiln_precision_vtable, update_scale)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_PRECISION_H_ */
