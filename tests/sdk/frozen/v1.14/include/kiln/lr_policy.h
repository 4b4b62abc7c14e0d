/*
 * kiln/lr_policy.h — the learning-rate policy component. A policy maps an iteration to a learning
 * rate after warm-up; the host applies warm-up (constant or linear, Pet's formula) itself for
 * iterations 1..warmup_iters, and per-group scales after the policy.
 */
#ifndef KILN_LR_POLICY_H_
#define KILN_LR_POLICY_H_

#include "kiln/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The schedule's frame, in iterations (epochs already converted by the host). */
typedef struct kiln_lr_schedule {
  size_t struct_size;      /* sizeof(kiln_lr_schedule) as the host knows it */
  double base_lr;          /* base learning rate after linear batch scaling */
  int64_t max_iters;       /* total optimizer steps of the run */
  int64_t warmup_iters;    /* iterations handled by the host's warm-up (0: none) */
  int64_t iters_per_epoch; /* optimizer steps per epoch, for policies whose options are in epochs */
} kiln_lr_schedule;

/* The LR policy vtable (kiln_component_descriptor.vtable for KILN_COMPONENT_LR_POLICY). */
typedef struct kiln_lr_policy_vtable {
  size_t struct_size; /* sizeof(kiln_lr_policy_vtable) as the plugin knows it */

  /* Required. Creates an instance for `schedule` from validated options (both borrowed for the
   * call). `*out` receives plugin-owned state, released by `destroy`. */
  KILN_MUST_USE_SLOT kiln_status* (*create)(const kiln_host_api* host, const kiln_options* options,
                                            const kiln_lr_schedule* schedule, void** out);

  /* Required. Releases an instance. NULL is ignored. */
  void (*destroy)(void* instance);

  /* Required. Writes the learning rate for 1-based iteration `iter` (> warmup_iters) to `*lr`.
   * `iter` is the number of the optimizer step about to run, counted from the start of the run
   * with the warm-up's iterations included: the host asks warmup_iters + 1 for the first step
   * after warm-up (1 when there is none), and a step the schedule does not count (skipped, under
   * count = "applied") leaves the next step at the same number. PyTorch's schedulers stepped once
   * per iteration train step `iter` at last_epoch = iter - 1.
   * Pure: the same iter gives the same value (so resume and `kiln lr-schedule` need no state).
   * Thread-safe for one instance. */
  KILN_MUST_USE_SLOT kiln_status* (*lr_at)(void* instance, int64_t iter, double* lr);
} kiln_lr_policy_vtable;

/* The vtable with every slot named: KILN_LR_POLICY_VTABLE_INIT(create, destroy, lr_at). */
#define KILN_LR_POLICY_VTABLE_INIT(create_, destroy_, lr_at_)                                    \
  {                                                                                              \
    KILN_FIELD_(struct_size)                                                                     \
    sizeof(kiln_lr_policy_vtable), KILN_FIELD_(create)(create_), KILN_FIELD_(destroy)(destroy_), \
        KILN_FIELD_(lr_at)(lr_at_)                                                               \
  }
#define KILN_LR_POLICY_VTABLE_V1_SIZE KILN_SIZE_UP_TO(kiln_lr_policy_vtable, lr_at)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_LR_POLICY_H_ */
