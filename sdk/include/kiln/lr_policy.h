/*
 * kiln/lr_policy.h — the learning-rate policy component. A policy maps an iteration to a learning
 * rate after warm-up; the host applies warm-up (constant or linear, Pet's formula) itself for
 * iterations 1..warmup_iters, and per-group scales after the policy. Since ABI 1.15 a policy may
 * also react to evaluations (`observe`, as torch's ReduceLROnPlateau), keeping state that the
 * host checkpoints (`get_state` / `set_state`).
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

/* One evaluation's results (ABI 1.15), for kiln_lr_policy_vtable.observe. */
typedef struct kiln_lr_observation {
  size_t struct_size; /* sizeof(kiln_lr_observation) as the host knows it */
  int64_t iter;       /* optimizer steps the schedule had counted when the evaluation ran: the
                         next step trains at lr_at(iter + 1) */
  int64_t epoch;      /* the epoch the evaluation closed (1-based; 0 before the first) */
  size_t count;       /* entries of names and values */
  /* Borrowed for the call. The evaluation's metrics by name: "loss" (the run's loss over the
   * split), "top1" and "top5" (accuracies as fractions in [0, 1], for data of one class per
   * sample), "map" (mean average precision, for multi-label data). Only metrics the evaluation
   * has are given; a policy looks its own up by name and refuses (KILN_ERR_INVALID_ARGUMENT,
   * naming the metric) when it is missing. */
  const char* const* names;
  const double* values;
} kiln_lr_observation;

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
   * Pure: the same iter gives the same value (so resume and `kiln lr-schedule` need no state);
   * for a policy with observe (1.15), between two observations. Thread-safe for one instance. */
  KILN_MUST_USE_SLOT kiln_status* (*lr_at)(void* instance, int64_t iter, double* lr);

  /* Since ABI 1.15. Optional (NULL: the policy does not react to evaluations, and lr_at is pure
   * as above). Takes one evaluation's results. The host calls it after each evaluation of the
   * run, on every rank with the same all-reduced values, never at once with another call on the
   * instance; lr_at is then pure between two observations (the same iter gives the same value
   * until the next one), which is what `kiln lr-schedule` relies on. `observation` is borrowed
   * for the call. A policy with observe should have get_state and set_state: without them a
   * resumed run starts its reactions afresh. */
  KILN_MUST_USE_SLOT kiln_status* (*observe)(void* instance,
                                             const kiln_lr_observation* observation);

  /* Since ABI 1.15. Optional (NULL: nothing to keep). What the observations did, as numbers, for
   * checkpoints: get_state writes up to `capacity` values to `values` (host-owned) and sets
   * `*count` to how many there are (call with capacity 0 to ask); set_state restores what
   * get_state wrote (borrowed `values`) into a fresh instance made with the same options and
   * schedule, after which lr_at and observe continue exactly as in the instance that wrote them.
   * Values are stored as doubles, bit for bit. */
  KILN_MUST_USE_SLOT kiln_status* (*get_state)(void* instance, double* values, size_t capacity,
                                               size_t* count);
  KILN_MUST_USE_SLOT kiln_status* (*set_state)(void* instance, const double* values, size_t count);
} kiln_lr_policy_vtable;

/* The 1.0 slots named, the later ones NULL: KILN_LR_POLICY_VTABLE_INIT(create, destroy, lr_at). */
#define KILN_LR_POLICY_VTABLE_INIT(create_, destroy_, lr_at_) \
  KILN_LR_POLICY_VTABLE_FULL_INIT(create_, destroy_, lr_at_, NULL, NULL, NULL)
#define KILN_LR_POLICY_VTABLE_V1_SIZE KILN_SIZE_UP_TO(kiln_lr_policy_vtable, lr_at)
#define KILN_LR_POLICY_VTABLE_V1_14_SIZE KILN_LR_POLICY_VTABLE_V1_SIZE /* 1.1 to 1.14 alike */

/* Every slot named, the 1.15 ones included (each may be NULL):
 * KILN_LR_POLICY_VTABLE_FULL_INIT(create, destroy, lr_at, observe, get_state, set_state). */
#define KILN_LR_POLICY_VTABLE_FULL_INIT(create_, destroy_, lr_at_, observe_, get_state_,         \
                                        set_state_)                                              \
  {                                                                                              \
    KILN_FIELD_(struct_size)                                                                     \
    sizeof(kiln_lr_policy_vtable), KILN_FIELD_(create)(create_), KILN_FIELD_(destroy)(destroy_), \
        KILN_FIELD_(lr_at)(lr_at_), KILN_FIELD_(observe)(observe_),                              \
        KILN_FIELD_(get_state)(get_state_), KILN_FIELD_(set_state)(set_state_)                   \
  }

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_LR_POLICY_H_ */
