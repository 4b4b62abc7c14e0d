/*
 * linear — PyTorch's LinearLR after the warm-up: the base lr times a factor that moves linearly
 * from start_factor to end_factor over total_iters iterations, then stays, with
 * e = it − warm − 1:
 *   lr = base_lr·(start_factor + (end_factor − start_factor)·min(e, total_iters)/total_iters)
 * (torch updates the rate by a ratio each step; the closed form agrees to rounding).
 */
#include <stdlib.h>

#include "lr_common.h"

static const char kName[] = "linear";

typedef struct linear_policy {
  const kiln_host_api* host;
  double base_lr, start_factor, end_factor;
  int64_t total_iters, warmup_iters;
} linear_policy;

static void linear_destroy(void* instance) { free(instance); }

static kiln_status* linear_create(const kiln_host_api* host, const kiln_options* options,
                                  const kiln_lr_schedule* schedule, void** out) {
  int64_t scale = 1, total = 0;
  linear_policy* p;
  kiln_status* status;
  const double start = kiln_options_float(options, "start_factor", 1.0 / 3.0);
  if (!(start > 0.0)) {
    return kiln_lr_invalid(host, kName, "start_factor must be > 0, got %g", start);
  }
  if ((status = kiln_lr_duration_scale(host, kName, options, schedule, &scale)) != NULL) {
    return status;
  }
  if ((status = kiln_lr_to_iters(host, kName, "total_iters",
                                 kiln_options_int(options, "total_iters", 5), scale, &total)) !=
      NULL) {
    return status;
  }
  p = (linear_policy*)calloc(1, sizeof *p);
  if (p == NULL) return kiln_lr_out_of_memory(host, kName);
  p->host = host;
  p->base_lr = schedule->base_lr;
  p->start_factor = start;
  p->end_factor = kiln_options_float(options, "end_factor", 1.0);
  p->total_iters = total;
  p->warmup_iters = schedule->warmup_iters;
  *out = p;
  return NULL;
}

static kiln_status* linear_lr_at(void* instance, int64_t iter, double* lr) {
  const linear_policy* p = (const linear_policy*)instance;
  kiln_status* status = kiln_lr_check_iter(p->host, kName, iter);
  int64_t e;
  if (status != NULL) return status;
  e = iter - p->warmup_iters - 1;
  if (e < 0) e = 0;
  if (e > p->total_iters) e = p->total_iters;
  *lr = p->base_lr *
        (p->start_factor + (p->end_factor - p->start_factor) * (double)e / (double)p->total_iters);
  return NULL;
}

static const kiln_lr_policy_vtable linear_vtable =
    KILN_LR_POLICY_VTABLE_INIT(linear_create, linear_destroy, linear_lr_at);

static const kiln_option_spec linear_options[] = {
    KILN_OPTION_RANGE_INIT("start_factor", KILN_OPT_FLOAT, 0.0, 1.0, "0.3333333333333333",
                           "the first rate is base lr x start_factor, in (0, 1]"),
    KILN_OPTION_RANGE_INIT("end_factor", KILN_OPT_FLOAT, 0.0, 1.0, "1.0",
                           "the rate after total_iters is base lr x end_factor, in [0, 1]"),
    KILN_OPTION_MIN_INIT("total_iters", KILN_OPT_INT, 1.0, "5",
                         "iterations (epochs with by_epoch) the factor takes to move"),
    KILN_OPTION_INIT("by_epoch", KILN_OPT_BOOL, "false", "total_iters counts epochs"),
};

const kiln_component_descriptor kiln_lr_linear_component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "linear", KILN_VERSION_INIT(1, 0, 0),
    "PyTorch's LinearLR(start_factor, end_factor, total_iters) started after the warm-up: the "
    "base lr scaled by a factor moving linearly from start_factor to end_factor",
    &kiln_lr_capabilities, linear_options, &linear_vtable);
