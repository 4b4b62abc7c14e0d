/*
 * kiln_step — learning-rate policies "step" and "cosine" (Pet's STEP and COSINE), plain C99.
 * Warm-up is applied by the host; these only compute the post-warm-up rate.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/lr_policy.h"
#include "kiln/plugin.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* ---- step --------------------------------------------------------------------------------- */

typedef struct step_policy {
  double base_lr;
  double gamma;
  size_t step_count;
  int64_t* steps; /* strictly increasing, positive */
} step_policy;

static void step_destroy(void* instance) {
  step_policy* p = (step_policy*)instance;
  if (p == NULL) return;
  free(p->steps);
  free(p);
}

static kiln_status* step_create(const kiln_host_api* host, const kiln_options* options,
                                const kiln_lr_schedule* schedule, void** out) {
  char message[160];
  const kiln_option_value* steps = kiln_options_find(options, "steps");
  size_t count = (steps != NULL && steps->type == KILN_OPT_INT_LIST) ? steps->list_length : 0;
  double gamma = kiln_options_float(options, "gamma", 0.1);
  step_policy* p;
  size_t i;

  if (!(gamma > 0.0 && gamma <= 1.0)) {
    snprintf(message, sizeof message, "step: gamma must be in (0, 1], got %g", gamma);
    return host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
  }
  for (i = 0; i < count; ++i) {
    int64_t s = steps->int_list[i];
    if (s <= 0) {
      snprintf(message, sizeof message, "step: steps must be positive, got %lld at index %zu",
               (long long)s, i);
      return host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
    }
    if (i > 0 && s <= steps->int_list[i - 1]) {
      snprintf(message, sizeof message,
               "step: steps must be strictly increasing, got %lld after %lld at index %zu",
               (long long)s, (long long)steps->int_list[i - 1], i);
      return host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
    }
  }
  p = (step_policy*)calloc(1, sizeof *p);
  if (p == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "step: out of memory");
  if (count > 0) {
    p->steps = (int64_t*)malloc(count * sizeof *p->steps);
    if (p->steps == NULL) {
      free(p);
      return host->make_status(KILN_ERR_OUT_OF_MEMORY, "step: out of memory");
    }
    for (i = 0; i < count; ++i) p->steps[i] = steps->int_list[i];
  }
  p->step_count = count;
  p->base_lr = schedule->base_lr;
  p->gamma = gamma;
  *out = p;
  return NULL;
}

/* lr = base_lr * gamma^bisect_right(steps, iter): milestones already reached count. */
static kiln_status* step_lr_at(void* instance, int64_t iter, double* lr) {
  const step_policy* p = (const step_policy*)instance;
  size_t lo = 0, hi = p->step_count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (iter < p->steps[mid]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  *lr = p->base_lr * pow(p->gamma, (double)lo);
  return NULL;
}

static const kiln_lr_policy_vtable step_vtable = {sizeof(kiln_lr_policy_vtable), step_create,
                                                  step_destroy, step_lr_at};

static const kiln_option_spec step_options[] = {
    {sizeof(kiln_option_spec), "steps", KILN_OPT_INT_LIST, 1, 0, 0, 1.0, 0.0, "[]", NULL,
     "iterations at which the rate is multiplied by gamma (strictly increasing)"},
    {sizeof(kiln_option_spec), "gamma", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.1", NULL,
     "factor applied at each step, in (0, 1]"},
};

/* ---- cosine ------------------------------------------------------------------------------- */

typedef struct cosine_policy {
  double base_lr;
  double min_lr;
  int64_t warmup_iters;
  int64_t span; /* max_iters - warmup_iters, > 0 */
} cosine_policy;

static void cosine_destroy(void* instance) { free(instance); }

static kiln_status* cosine_create(const kiln_host_api* host, const kiln_options* options,
                                  const kiln_lr_schedule* schedule, void** out) {
  char message[160];
  double min_lr = kiln_options_float(options, "min_lr", 0.0);
  cosine_policy* p;
  if (min_lr < 0.0) {
    snprintf(message, sizeof message, "cosine: min_lr must be >= 0, got %g", min_lr);
    return host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
  }
  if (schedule->max_iters <= schedule->warmup_iters) {
    snprintf(message, sizeof message, "cosine: max_iters (%lld) must exceed warmup_iters (%lld)",
             (long long)schedule->max_iters, (long long)schedule->warmup_iters);
    return host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
  }
  p = (cosine_policy*)calloc(1, sizeof *p);
  if (p == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "cosine: out of memory");
  p->base_lr = schedule->base_lr;
  p->min_lr = min_lr;
  p->warmup_iters = schedule->warmup_iters;
  p->span = schedule->max_iters - schedule->warmup_iters;
  *out = p;
  return NULL;
}

/* Pet's COSINE, rescaled so it runs from base_lr (first post-warm-up iteration) to min_lr. */
static kiln_status* cosine_lr_at(void* instance, int64_t iter, double* lr) {
  const cosine_policy* p = (const cosine_policy*)instance;
  double phase = (double)(iter - p->warmup_iters - 1) * M_PI / (double)p->span;
  *lr = p->min_lr + (p->base_lr - p->min_lr) * 0.5 * (1.0 + cos(phase));
  return NULL;
}

static const kiln_lr_policy_vtable cosine_vtable = {sizeof(kiln_lr_policy_vtable), cosine_create,
                                                    cosine_destroy, cosine_lr_at};

static const kiln_option_spec cosine_options[] = {
    {sizeof(kiln_option_spec), "min_lr", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "0.0", NULL,
     "learning rate reached at the end of the run"},
};

/* ---- descriptor --------------------------------------------------------------------------- */

static const kiln_capabilities lr_caps = {sizeof(kiln_capabilities),
                                          KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA, 0, NULL};

static const kiln_component_descriptor step_component = {
    sizeof(kiln_component_descriptor),
    KILN_COMPONENT_LR_POLICY,
    0,
    "step",
    {1, 0, 0},
    "multiply the rate by gamma at each listed iteration",
    &lr_caps,
    sizeof step_options / sizeof step_options[0],
    step_options,
    &step_vtable};

static const kiln_component_descriptor cosine_component = {
    sizeof(kiln_component_descriptor),
    KILN_COMPONENT_LR_POLICY,
    0,
    "cosine",
    {1, 0, 0},
    "half-cosine decay from base_lr to min_lr over the post-warm-up iterations",
    &lr_caps,
    sizeof cosine_options / sizeof cosine_options[0],
    cosine_options,
    &cosine_vtable};

static const kiln_component_descriptor* const components[] = {&step_component, &cosine_component};

static const kiln_plugin_descriptor descriptor = {sizeof(kiln_plugin_descriptor),
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR,
                                                  "kiln-step",
                                                  {1, 0, 0},
                                                  sizeof components / sizeof components[0],
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
