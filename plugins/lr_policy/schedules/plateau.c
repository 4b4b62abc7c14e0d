/*
 * plateau — PyTorch's ReduceLROnPlateau (ABI 1.15: observe, get_state, set_state). The rate
 * starts at base_lr and is multiplied by `factor` (floored at min_lr) when the evaluation metric
 * `metric` has not improved for more than `patience` evaluations in a row, then rests for
 * `cooldown` evaluations. Each observation is one scheduler.step(metric) of torch's:
 *   better:  mode min, rel: a < best·(1 − threshold); abs: a < best − threshold
 *            mode max, rel: a > best·(1 + threshold); abs: a > best + threshold
 *   then     in cooldown: cooldown_counter −= 1 and the bad count is reset;
 *            more than `patience` bad ones: lr = max(lr·factor, min_lr), applied only when it
 *            lowers lr by more than eps; cooldown_counter = cooldown; the bad count is reset.
 * The rate applies from the step after the evaluation on. min_lr and eps apply to this rate, the
 * base group's; other groups scale it by their lr multiplier (torch floors each group's own rate).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lr_common.h"

static const char kName[] = "plateau";

typedef struct plateau_policy {
  const kiln_host_api* host;
  char metric[16];
  int maximize;     /* mode "max" */
  int absolute;     /* threshold_mode "abs" */
  double factor;    /* in (0, 1) */
  int64_t patience; /* >= 0 */
  double threshold; /* >= 0 */
  int64_t cooldown; /* >= 0 */
  double min_lr;    /* >= 0 */
  double eps;       /* >= 0 */
  /* State (get_state / set_state, in this order). */
  double lr;
  double best;
  int64_t num_bad;
  int64_t cooldown_counter;
  int64_t observed; /* evaluations seen: torch's last_epoch */
} plateau_policy;

enum { kStateCount = 5 };

static void plateau_destroy(void* instance) { free(instance); }

static kiln_status* plateau_create(const kiln_host_api* host, const kiln_options* options,
                                   const kiln_lr_schedule* schedule, void** out) {
  const char* metric = kiln_options_string(options, "metric", "loss");
  const char* mode = kiln_options_string(options, "mode", "min");
  const char* threshold_mode = kiln_options_string(options, "threshold_mode", "rel");
  plateau_policy* p;
  if (strlen(metric) >= sizeof p->metric) {
    return kiln_lr_invalid(host, kName, "metric '%s' is not one of loss, top1, top5, map", metric);
  }
  p = (plateau_policy*)calloc(1, sizeof *p);
  if (p == NULL) return kiln_lr_out_of_memory(host, kName);
  p->host = host;
  strcpy(p->metric, metric);
  p->maximize = strcmp(mode, "max") == 0;
  p->absolute = strcmp(threshold_mode, "abs") == 0;
  p->factor = kiln_options_float(options, "factor", 0.1);
  p->patience = kiln_options_int(options, "patience", 10);
  p->threshold = kiln_options_float(options, "threshold", 1e-4);
  p->cooldown = kiln_options_int(options, "cooldown", 0);
  p->min_lr = kiln_options_float(options, "min_lr", 0.0);
  p->eps = kiln_options_float(options, "eps", 1e-8);
  if (!(p->factor < 1.0)) { /* torch: "Factor should be < 1.0." (the schema holds [0, 1]) */
    const double factor = p->factor;
    free(p);
    return kiln_lr_invalid(host, kName, "factor must be < 1, got %g", factor);
  }
  p->lr = schedule->base_lr;
  p->best = p->maximize ? -INFINITY : INFINITY; /* torch's mode_worse */
  *out = p;
  return NULL;
}

static kiln_status* plateau_lr_at(void* instance, int64_t iter, double* lr) {
  const plateau_policy* p = (const plateau_policy*)instance;
  kiln_status* status = kiln_lr_check_iter(p->host, kName, iter);
  if (status != NULL) return status;
  *lr = p->lr;
  return NULL;
}

static int plateau_is_better(const plateau_policy* p, double a) {
  if (!p->maximize && !p->absolute) return a < p->best * (1.0 - p->threshold);
  if (!p->maximize) return a < p->best - p->threshold;
  if (!p->absolute) return a > p->best * (p->threshold + 1.0);
  return a > p->best + p->threshold;
}

static kiln_status* plateau_observe(void* instance, const kiln_lr_observation* observation) {
  plateau_policy* p = (plateau_policy*)instance;
  size_t i;
  double current = 0.0;
  int found = 0;
  for (i = 0; i < observation->count; ++i) {
    if (strcmp(observation->names[i], p->metric) == 0) {
      current = observation->values[i];
      found = 1;
      break;
    }
  }
  if (!found) {
    char given[96] = "";
    for (i = 0; i < observation->count; ++i) {
      if (strlen(given) + strlen(observation->names[i]) + 3 >= sizeof given) break;
      if (i > 0) strcat(given, ", ");
      strcat(given, observation->names[i]);
    }
    return kiln_lr_invalid(p->host, kName,
                           "metric '%s' is not among the evaluation's (after step %lld: %s)",
                           p->metric, (long long)observation->iter, given);
  }
  ++p->observed;
  if (plateau_is_better(p, current)) {
    p->best = current;
    p->num_bad = 0;
  } else {
    ++p->num_bad;
  }
  if (p->cooldown_counter > 0) {
    --p->cooldown_counter;
    p->num_bad = 0; /* bad evaluations are ignored while cooling down */
  }
  if (p->num_bad > p->patience) {
    const double lowered = fmax(p->lr * p->factor, p->min_lr);
    if (p->lr - lowered > p->eps) p->lr = lowered;
    p->cooldown_counter = p->cooldown;
    p->num_bad = 0;
  }
  return NULL;
}

static kiln_status* plateau_get_state(void* instance, double* values, size_t capacity,
                                      size_t* count) {
  const plateau_policy* p = (const plateau_policy*)instance;
  const double state[kStateCount] = {p->lr, p->best, (double)p->num_bad,
                                     (double)p->cooldown_counter, (double)p->observed};
  size_t i;
  for (i = 0; i < kStateCount && i < capacity; ++i) values[i] = state[i];
  *count = kStateCount;
  return NULL;
}

static kiln_status* plateau_set_state(void* instance, const double* values, size_t count) {
  plateau_policy* p = (plateau_policy*)instance;
  if (count != kStateCount) {
    return kiln_lr_invalid(p->host, kName, "state has %zu values, expected %d", count,
                           (int)kStateCount);
  }
  if (!(values[0] >= 0.0) || !isfinite(values[0]) || !(values[2] >= 0.0) || !(values[3] >= 0.0) ||
      !(values[4] >= 0.0)) {
    return kiln_lr_invalid(p->host, kName, "state (lr %g, counters %g, %g, %g) is not valid",
                           values[0], values[2], values[3], values[4]);
  }
  p->lr = values[0];
  p->best = values[1];
  p->num_bad = (int64_t)values[2];
  p->cooldown_counter = (int64_t)values[3];
  p->observed = (int64_t)values[4];
  return NULL;
}

static const kiln_lr_policy_vtable plateau_vtable =
    KILN_LR_POLICY_VTABLE_FULL_INIT(plateau_create, plateau_destroy, plateau_lr_at, plateau_observe,
                                    plateau_get_state, plateau_set_state);

static const kiln_option_spec plateau_options[] = {
    KILN_OPTION_CHOICES_INIT("metric", "loss,top1,top5,map", "\"loss\"",
                             "the evaluation metric watched: loss, top1 or top5 (fractions), map"),
    KILN_OPTION_CHOICES_INIT("mode", "min,max", "\"min\"",
                             "min: the metric should fall (loss); max: rise (top1, top5, map)"),
    KILN_OPTION_RANGE_INIT("factor", KILN_OPT_FLOAT, 0.0, 1.0, "0.1",
                           "the rate is multiplied by this when the metric stalls, in [0, 1)"),
    KILN_OPTION_MIN_INIT("patience", KILN_OPT_INT, 0.0, "10",
                         "evaluations without improvement tolerated before lowering, >= 0"),
    KILN_OPTION_MIN_INIT("threshold", KILN_OPT_FLOAT, 0.0, "1e-4",
                         "least change that counts as an improvement, >= 0"),
    KILN_OPTION_CHOICES_INIT("threshold_mode", "rel,abs", "\"rel\"",
                             "rel: relative to the best so far; abs: in the metric's units"),
    KILN_OPTION_MIN_INIT("cooldown", KILN_OPT_INT, 0.0, "0",
                         "evaluations after a lowering during which stalls are not counted, >= 0"),
    KILN_OPTION_MIN_INIT("min_lr", KILN_OPT_FLOAT, 0.0, "0.0", "floor of the rate, >= 0"),
    KILN_OPTION_MIN_INIT("eps", KILN_OPT_FLOAT, 0.0, "1e-8",
                         "a lowering smaller than this is not applied, >= 0"),
};

const kiln_component_descriptor kiln_lr_plateau_component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "plateau", KILN_VERSION_INIT(1, 0, 0),
    "PyTorch's ReduceLROnPlateau: the base lr, multiplied by factor (floored at min_lr) after "
    "more than patience evaluations in a row without improving metric by threshold, then "
    "cooldown evaluations of rest; reacts to evaluations (observe) and keeps its state in "
    "checkpoints",
    &kiln_lr_capabilities, plateau_options, &plateau_vtable);
