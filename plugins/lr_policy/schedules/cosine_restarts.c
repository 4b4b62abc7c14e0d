/*
 * cosine_restarts — PyTorch's CosineAnnealingWarmRestarts (SGDR) after the warm-up: with
 * e = it − warm − 1, cycles of t_0, t_0·t_mult, t_0·t_mult², … iterations, and within a cycle
 * of length T_i at position T_cur
 *   lr = min_lr + (base_lr − min_lr)·(1 + cos(π·T_cur/T_i))/2
 * so each cycle starts at base_lr. Durations in epochs with by_epoch (mmengine's
 * convert_to_iter_based: t_0 × iters_per_epoch).
 */
#include <math.h>
#include <stdlib.h>

#include "lr_common.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

static const char kName[] = "cosine_restarts";

typedef struct cosine_restarts_policy {
  const kiln_host_api* host;
  double base_lr;
  double min_lr;
  int64_t warmup_iters;
  int64_t t_0;    /* iterations of the first cycle, >= 1 */
  int64_t t_mult; /* each cycle is this many times the one before, >= 1 */
} cosine_restarts_policy;

static void cosine_restarts_destroy(void* instance) { free(instance); }

static kiln_status* cosine_restarts_create(const kiln_host_api* host, const kiln_options* options,
                                           const kiln_lr_schedule* schedule, void** out) {
  const double min_lr = kiln_options_float(options, "min_lr", 0.0);
  int64_t scale = 1, t_0 = 0;
  cosine_restarts_policy* p;
  kiln_status* status;
  if (kiln_options_find(options, "t_0") == NULL)
    return kiln_lr_invalid(host, kName, "t_0 is required");
  if ((status = kiln_lr_check_min_lr(host, kName, min_lr, schedule->base_lr)) != NULL) {
    return status;
  }
  if ((status = kiln_lr_duration_scale(host, kName, options, schedule, &scale)) != NULL) {
    return status;
  }
  if ((status = kiln_lr_to_iters(host, kName, "t_0", kiln_options_int(options, "t_0", 1), scale,
                                 &t_0)) != NULL) {
    return status;
  }
  p = (cosine_restarts_policy*)calloc(1, sizeof *p);
  if (p == NULL) return kiln_lr_out_of_memory(host, kName);
  p->host = host;
  p->base_lr = schedule->base_lr;
  p->min_lr = min_lr;
  p->warmup_iters = schedule->warmup_iters;
  p->t_0 = t_0;
  p->t_mult = kiln_options_int(options, "t_mult", 1);
  *out = p;
  return NULL;
}

static kiln_status* cosine_restarts_lr_at(void* instance, int64_t iter, double* lr) {
  const cosine_restarts_policy* p = (const cosine_restarts_policy*)instance;
  kiln_status* status = kiln_lr_check_iter(p->host, kName, iter);
  int64_t t_cur, t_i = p->t_0;
  if (status != NULL) return status;
  t_cur = iter - p->warmup_iters - 1;
  if (t_cur < 0) t_cur = 0;
  if (p->t_mult == 1) {
    t_cur %= t_i;
  } else {
    /* Whole cycles, as torch's step() walks them; at most ~63 of them fit in int64. */
    while (t_cur >= t_i) {
      t_cur -= t_i;
      if (t_i > INT64_MAX / p->t_mult) break;
      t_i *= p->t_mult;
    }
  }
  *lr =
      p->min_lr + (p->base_lr - p->min_lr) * (1.0 + cos(M_PI * (double)t_cur / (double)t_i)) / 2.0;
  return NULL;
}

static const kiln_lr_policy_vtable cosine_restarts_vtable = KILN_LR_POLICY_VTABLE_INIT(
    cosine_restarts_create, cosine_restarts_destroy, cosine_restarts_lr_at);

static const kiln_option_spec cosine_restarts_options[] = {
    KILN_OPTION_MIN_INIT("t_0", KILN_OPT_INT, 1.0, NULL,
                         "length of the first cycle (T_0), in iterations (epochs with by_epoch)"),
    KILN_OPTION_RANGE_INIT("t_mult", KILN_OPT_INT, 1.0, 1000.0, "1",
                           "each cycle is t_mult times the one before (T_mult), >= 1"),
    KILN_OPTION_MIN_INIT("min_lr", KILN_OPT_FLOAT, 0.0, "0.0",
                         "floor of each cycle (eta_min), in [0, base lr]"),
    KILN_OPTION_INIT("by_epoch", KILN_OPT_BOOL, "false", "t_0 counts epochs, not iterations"),
};

const kiln_component_descriptor kiln_lr_cosine_restarts_component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "cosine_restarts", KILN_VERSION_INIT(1, 0, 0),
    "PyTorch's CosineAnnealingWarmRestarts(T_0 = t_0, T_mult = t_mult, eta_min = min_lr) "
    "started after the warm-up: cosine cycles that restart at the base lr, each t_mult times "
    "longer",
    &kiln_lr_capabilities, cosine_restarts_options, &cosine_restarts_vtable);
