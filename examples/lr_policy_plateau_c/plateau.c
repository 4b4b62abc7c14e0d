/*
 * c_plateau — an out-of-tree learning-rate policy that reacts to evaluations (ABI 1.15), in plain
 * C99 against the installed Kiln SDK alone: torch's ReduceLROnPlateau with a relative threshold
 * and no cooldown. The rate starts at the base lr; after more than `patience` evaluations in a
 * row whose `metric` is not better than the best so far by the factor (1 - threshold) (mode
 * "min") or (1 + threshold) (mode "max"), it is multiplied by `factor`, floored at `min_lr`.
 *
 * Three slots beyond lr_at make it work:
 *   observe    takes each evaluation's metrics (all-reduced: every rank sees the same);
 *   get_state  hands the host what the observations did, as doubles, for each checkpoint;
 *   set_state  puts that back into a fresh instance when a run resumes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/lr_policy.h"
#include "kiln/plugin.h"

typedef struct plateau {
  const kiln_host_api* host; /* valid for the life of the process */
  char metric[8];            /* "loss", "top1", "top5" or "map" (the schema's choices) */
  int maximize;              /* mode "max" */
  double factor, threshold, min_lr;
  int64_t patience;
  /* What the observations did: the state a checkpoint keeps. */
  double lr, best;
  int64_t bad; /* evaluations in a row without improvement */
} plateau;

static kiln_status* refuse(const kiln_host_api* host, const char* message) {
  return host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
}

static kiln_status* create(const kiln_host_api* host, const kiln_options* options,
                           const kiln_lr_schedule* schedule, void** out) {
  /* Options arrive validated against the schema below. */
  plateau* p = (plateau*)calloc(1, sizeof *p);
  if (p == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "c_plateau: out of memory");
  p->host = host;
  snprintf(p->metric, sizeof p->metric, "%s", kiln_options_string(options, "metric", "loss"));
  p->maximize = strcmp(kiln_options_string(options, "mode", "min"), "max") == 0;
  p->factor = kiln_options_float(options, "factor", 0.1);
  p->threshold = kiln_options_float(options, "threshold", 1e-4);
  p->min_lr = kiln_options_float(options, "min_lr", 0.0);
  p->patience = kiln_options_int(options, "patience", 10);
  p->lr = schedule->base_lr;
  p->best = p->maximize ? -INFINITY : INFINITY;
  *out = p;
  return NULL;
}

static void destroy(void* instance) { free(instance); }

/* Pure between two observations: the rate the last one left. */
static kiln_status* lr_at(void* instance, int64_t iter, double* lr) {
  const plateau* p = (const plateau*)instance;
  if (iter < 1) return refuse(p->host, "c_plateau: iteration must be >= 1");
  *lr = p->lr;
  return NULL;
}

static kiln_status* observe(void* instance, const kiln_lr_observation* observation) {
  plateau* p = (plateau*)instance;
  size_t i;
  for (i = 0; i < observation->count; ++i) {
    if (strcmp(observation->names[i], p->metric) == 0) {
      const double a = observation->values[i];
      const int better =
          p->maximize ? a > p->best * (1.0 + p->threshold) : a < p->best * (1.0 - p->threshold);
      if (better) {
        p->best = a;
        p->bad = 0;
      } else if (++p->bad > p->patience) {
        p->lr = fmax(p->lr * p->factor, p->min_lr);
        p->bad = 0;
      }
      return NULL;
    }
  }
  {
    char message[96];
    snprintf(message, sizeof message, "c_plateau: the evaluation has no metric '%s'", p->metric);
    return refuse(p->host, message);
  }
}

static kiln_status* get_state(void* instance, double* values, size_t capacity, size_t* count) {
  const plateau* p = (const plateau*)instance;
  const double state[3] = {p->lr, p->best, (double)p->bad};
  size_t i;
  for (i = 0; i < 3 && i < capacity; ++i) values[i] = state[i];
  *count = 3;
  return NULL;
}

static kiln_status* set_state(void* instance, const double* values, size_t count) {
  plateau* p = (plateau*)instance;
  if (count != 3 || !(values[0] >= 0.0) || !(values[2] >= 0.0)) {
    return refuse(p->host, "c_plateau: the checkpoint's state is not one this policy wrote");
  }
  p->lr = values[0];
  p->best = values[1];
  p->bad = (int64_t)values[2];
  return NULL;
}

static const kiln_lr_policy_vtable vtable =
    KILN_LR_POLICY_VTABLE_FULL_INIT(create, destroy, lr_at, observe, get_state, set_state);

static const kiln_capabilities caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA);

static const kiln_option_spec options[] = {
    KILN_OPTION_CHOICES_INIT("metric", "loss,top1,top5,map", "\"loss\"", "the metric watched"),
    KILN_OPTION_CHOICES_INIT("mode", "min,max", "\"min\"", "min: it should fall; max: rise"),
    KILN_OPTION_RANGE_INIT("factor", KILN_OPT_FLOAT, 0.0, 0.999, "0.1",
                           "the rate is multiplied by this on a plateau"),
    KILN_OPTION_MIN_INIT("patience", KILN_OPT_INT, 0.0, "10",
                         "evaluations without improvement tolerated"),
    KILN_OPTION_MIN_INIT("threshold", KILN_OPT_FLOAT, 0.0, "1e-4",
                         "relative change that counts as an improvement"),
    KILN_OPTION_MIN_INIT("min_lr", KILN_OPT_FLOAT, 0.0, "0.0", "floor of the rate"),
};

static const kiln_component_descriptor component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "c_plateau", KILN_VERSION_INIT(1, 0, 0),
    "ReduceLROnPlateau (relative threshold, no cooldown) in plain C", &caps, options, &vtable);

static const kiln_component_descriptor* const components[] = {&component};

static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("plateau-example", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
