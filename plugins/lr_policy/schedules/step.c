/*
 * step — Pet's STEP, lr·gamma^bisect_right(steps, it): iteration s itself trains at the decayed
 * rate; or PyTorch's StepLR stepped once per iteration, lr·gamma^floor((it − 1)/step_size): the
 * step at iteration it runs at torch's last_epoch = it − 1, so the first decay is at
 * step_size + 1. Exactly one of steps and step_size is given. Iterations count from the start of
 * the run, warm-up included. Until 2.0 step_size decayed at step_size itself, one iteration
 * ahead of StepLR.
 */
#include <math.h>
#include <stdlib.h>

#include "lr_common.h"

static const char kName[] = "step";

typedef struct step_policy {
  const kiln_host_api* host;
  double base_lr;
  double gamma;
  int64_t step_size; /* iterations between decays; 0 when `steps` is used */
  size_t step_count;
  int64_t* steps; /* iterations, strictly increasing, positive */
} step_policy;

static void step_destroy(void* instance) {
  step_policy* p = (step_policy*)instance;
  if (p == NULL) return;
  free(p->steps);
  free(p);
}

static kiln_status* step_create(const kiln_host_api* host, const kiln_options* options,
                                const kiln_lr_schedule* schedule, void** out) {
  double gamma = kiln_options_float(options, "gamma", 0.1);
  int64_t step_size = kiln_options_int(options, "step_size", 0);
  const kiln_option_value* steps_value = kiln_options_find(options, "steps");
  size_t listed = (steps_value != NULL && steps_value->type == KILN_OPT_INT_LIST)
                      ? steps_value->list_length
                      : 0;
  int64_t scale = 1, size_iters = 0;
  int64_t* steps = NULL;
  size_t count = 0;
  step_policy* p;
  kiln_status* status;

  if ((status = kiln_lr_check_gamma(host, kName, gamma)) != NULL) return status;
  if (step_size < 0) {
    return kiln_lr_invalid(host, kName, "step_size must be >= 0 (0: unset), got %lld",
                           (long long)step_size);
  }
  if (listed > 0 && step_size > 0) {
    return kiln_lr_invalid(host, kName,
                           "give either steps or step_size, not both (steps has %zu entries, "
                           "step_size is %lld)",
                           listed, (long long)step_size);
  }
  if (listed == 0 && step_size == 0) {
    return kiln_lr_invalid(host, kName,
                           "give either steps (a list of decay points) or step_size (a period); "
                           "both are unset");
  }
  if ((status = kiln_lr_duration_scale(host, kName, options, schedule, &scale)) != NULL) {
    return status;
  }
  if (step_size > 0 && (status = kiln_lr_to_iters(host, kName, "step_size", step_size, scale,
                                                  &size_iters)) != NULL) {
    return status;
  }
  status = kiln_lr_read_boundaries(host, kName, options, "steps", 0, scale, &steps, &count);
  if (status != NULL) return status;

  p = (step_policy*)calloc(1, sizeof *p);
  if (p == NULL) {
    free(steps);
    return kiln_lr_out_of_memory(host, kName);
  }
  p->host = host;
  p->base_lr = schedule->base_lr;
  p->gamma = gamma;
  p->step_size = size_iters;
  p->step_count = count;
  p->steps = steps;
  *out = p;
  return NULL;
}

static kiln_status* step_lr_at(void* instance, int64_t iter, double* lr) {
  const step_policy* p = (const step_policy*)instance;
  kiln_status* status = kiln_lr_check_iter(p->host, kName, iter);
  int64_t decays;
  if (status != NULL) return status;
  decays = p->step_size > 0 ? (iter - 1) / p->step_size
                            : (int64_t)kiln_lr_bisect_right(p->steps, p->step_count, iter);
  *lr = p->base_lr * pow(p->gamma, (double)decays);
  return NULL;
}

static const kiln_lr_policy_vtable step_vtable =
    KILN_LR_POLICY_VTABLE_INIT(step_create, step_destroy, step_lr_at);

static const kiln_option_spec step_options[] = {
    KILN_OPTION_MIN_INIT(
        "steps", KILN_OPT_INT_LIST, 1.0, "[]",
        "Pet STEPS: iterations (epochs with by_epoch: s x iterations per epoch, the last iteration "
        "of epoch s) from which on lr is multiplied by gamma once more; strictly increasing"),
    KILN_OPTION_MIN_INIT(
        "step_size", KILN_OPT_INT, 0.0, "0",
        "StepLR period: multiply by gamma every step_size iterations (epochs), first at iteration "
        "step_size + 1 (the first of epoch step_size + 1); 0 = use steps"),
    KILN_OPTION_RANGE_INIT("gamma", KILN_OPT_FLOAT, 0.0, 1.0, "0.1",
                           "factor applied at each decay, in (0, 1]"),
    KILN_OPTION_INIT("by_epoch", KILN_OPT_BOOL, "false",
                     "steps and step_size are in epochs, converted with the iterations per epoch"),
};

const kiln_component_descriptor kiln_lr_step_component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "step", KILN_VERSION_INIT(2, 0, 0),
    "with steps, Pet's STEP: lr x gamma^(how many steps are <= it), iteration s itself at the "
    "lower rate; with step_size, PyTorch's StepLR stepped every iteration (with by_epoch: every "
    "epoch): lr x gamma^floor((it - 1) / step_size). Both count from the start of the run, "
    "warm-up included. Changed in 2.0: 1.x decayed step_size at iteration step_size itself, one "
    "ahead of StepLR; steps are unchanged",
    &kiln_lr_capabilities, step_options, &step_vtable);
