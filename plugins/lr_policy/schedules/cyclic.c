/*
 * cyclic — PyTorch's CyclicLR (the rate; cycle_momentum needs schedules of other
 * hyperparameters, not in this ABI yet) after the warm-up, between the base lr (CyclicLR's
 * base_lr) and max_lr: with e = it − warm − 1, a cycle of step_size_up + step_size_down
 * iterations,
 *   cycle = floor(1 + e/total), x = 1 + e/total − cycle
 *   scale = x/ratio while rising (x <= ratio = up/total), else (x − 1)/(ratio − 1)
 *   lr = base_lr + (max_lr − base_lr)·scale·f
 * with f = 1 (triangular), 1/2^(cycle − 1) (triangular2) or gamma^e (exp_range), as torch
 * computes it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lr_common.h"

static const char kName[] = "cyclic";

enum cyclic_mode { kTriangular, kTriangular2, kExpRange };

typedef struct cyclic_policy {
  const kiln_host_api* host;
  double base_lr, max_lr, gamma;
  double total, ratio; /* cycle length, share of it rising */
  int64_t warmup_iters;
  enum cyclic_mode mode;
} cyclic_policy;

static void cyclic_destroy(void* instance) { free(instance); }

static kiln_status* cyclic_create(const kiln_host_api* host, const kiln_options* options,
                                  const kiln_lr_schedule* schedule, void** out) {
  const double max_lr = kiln_options_float(options, "max_lr", 0.0);
  const int64_t up = kiln_options_int(options, "step_size_up", 2000);
  int64_t down = kiln_options_int(options, "step_size_down", 0);
  const char* mode = kiln_options_string(options, "mode", "triangular");
  cyclic_policy* p;
  if (kiln_options_find(options, "max_lr") == NULL) {
    return kiln_lr_invalid(host, kName, "max_lr is required");
  }
  if (down == 0) down = up; /* torch: step_size_down = None */
  p = (cyclic_policy*)calloc(1, sizeof *p);
  if (p == NULL) return kiln_lr_out_of_memory(host, kName);
  p->host = host;
  p->base_lr = schedule->base_lr;
  p->max_lr = max_lr;
  p->gamma = kiln_options_float(options, "gamma", 1.0);
  p->total = (double)up + (double)down;
  p->ratio = (double)up / p->total;
  p->warmup_iters = schedule->warmup_iters;
  p->mode = strcmp(mode, "triangular2") == 0 ? kTriangular2
            : strcmp(mode, "exp_range") == 0 ? kExpRange
                                             : kTriangular;
  *out = p;
  return NULL;
}

static kiln_status* cyclic_lr_at(void* instance, int64_t iter, double* lr) {
  const cyclic_policy* p = (const cyclic_policy*)instance;
  kiln_status* status = kiln_lr_check_iter(p->host, kName, iter);
  double e, cycle, x, scale, height, f;
  if (status != NULL) return status;
  e = (double)(iter - p->warmup_iters - 1);
  if (e < 0.0) e = 0.0;
  cycle = floor(1.0 + e / p->total);
  x = 1.0 + e / p->total - cycle;
  scale = x <= p->ratio ? x / p->ratio : (x - 1.0) / (p->ratio - 1.0);
  height = (p->max_lr - p->base_lr) * scale;
  switch (p->mode) {
    case kTriangular2:
      f = 1.0 / pow(2.0, cycle - 1.0);
      break;
    case kExpRange:
      f = pow(p->gamma, e);
      break;
    default:
      f = 1.0;
  }
  *lr = p->base_lr + height * f;
  return NULL;
}

static const kiln_lr_policy_vtable cyclic_vtable =
    KILN_LR_POLICY_VTABLE_INIT(cyclic_create, cyclic_destroy, cyclic_lr_at);

static const kiln_option_spec cyclic_options[] = {
    KILN_OPTION_MIN_INIT("max_lr", KILN_OPT_FLOAT, 0.0, NULL,
                         "the top of each cycle (the base lr is its bottom), >= 0"),
    KILN_OPTION_MIN_INIT("step_size_up", KILN_OPT_INT, 1.0, "2000",
                         "iterations from the bottom to the top of a cycle"),
    KILN_OPTION_MIN_INIT("step_size_down", KILN_OPT_INT, 0.0, "0",
                         "iterations from the top back down (0: step_size_up)"),
    KILN_OPTION_CHOICES_INIT("mode", "triangular,triangular2,exp_range", "\"triangular\"",
                             "triangular: same height; triangular2: halved each cycle; "
                             "exp_range: scaled by gamma^iteration"),
    KILN_OPTION_RANGE_INIT("gamma", KILN_OPT_FLOAT, 0.0, 1.0, "1.0",
                           "exp_range's factor per iteration, in [0, 1]"),
};

const kiln_component_descriptor kiln_lr_cyclic_component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "cyclic", KILN_VERSION_INIT(1, 0, 0),
    "PyTorch's CyclicLR(base_lr = base lr, max_lr) for the rate, started after the warm-up: "
    "triangular, triangular2 or exp_range cycles between the base lr and max_lr",
    &kiln_lr_capabilities, cyclic_options, &cyclic_vtable);
