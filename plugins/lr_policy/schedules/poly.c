/*
 * poly — Pet's POLY with a floor:
 *   lr = min_lr + (base_lr − min_lr)·max(0, 1 − (it − warm − 1)/(max − warm))^power
 * so the first post-warm-up iteration gets base_lr and the rate stays at min_lr past the end.
 * With min_lr = 0 it equals PyTorch's PolynomialLR (total_iters = max − warm) at
 * last_epoch = it − warm − 1.
 */
#include <math.h>
#include <stdlib.h>

#include "lr_common.h"

static const char kName[] = "poly";

typedef struct poly_policy {
  const kiln_host_api* host;
  double base_lr;
  double min_lr;
  double power;
  int64_t warmup_iters;
  int64_t span; /* max_iters − warmup_iters, > 0 */
} poly_policy;

static void poly_destroy(void* instance) { free(instance); }

static kiln_status* poly_create(const kiln_host_api* host, const kiln_options* options,
                                const kiln_lr_schedule* schedule, void** out) {
  double min_lr = kiln_options_float(options, "min_lr", 0.0);
  double power = kiln_options_float(options, "power", 0.9);
  poly_policy* p;
  kiln_status* status;
  if (!(power > 0.0 && power <= 100.0)) {
    return kiln_lr_invalid(host, kName, "power must be in (0, 100], got %g", power);
  }
  if ((status = kiln_lr_check_min_lr(host, kName, min_lr, schedule->base_lr)) != NULL) {
    return status;
  }
  if ((status = kiln_lr_check_span(host, kName, schedule)) != NULL) return status;
  p = (poly_policy*)calloc(1, sizeof *p);
  if (p == NULL) return kiln_lr_out_of_memory(host, kName);
  p->host = host;
  p->base_lr = schedule->base_lr;
  p->min_lr = min_lr;
  p->power = power;
  p->warmup_iters = schedule->warmup_iters;
  p->span = schedule->max_iters - schedule->warmup_iters;
  *out = p;
  return NULL;
}

static kiln_status* poly_lr_at(void* instance, int64_t iter, double* lr) {
  const poly_policy* p = (const poly_policy*)instance;
  kiln_status* status = kiln_lr_check_iter(p->host, kName, iter);
  double remaining;
  if (status != NULL) return status;
  remaining = 1.0 - (double)(iter - p->warmup_iters - 1) / (double)p->span;
  if (remaining < 0.0) remaining = 0.0;
  *lr = p->min_lr + (p->base_lr - p->min_lr) * pow(remaining, p->power);
  return NULL;
}

static const kiln_lr_policy_vtable poly_vtable =
    KILN_LR_POLICY_VTABLE_INIT(poly_create, poly_destroy, poly_lr_at);

static const kiln_option_spec poly_options[] = {
    KILN_OPTION_RANGE_INIT("power", KILN_OPT_FLOAT, 0.0, 100.0, "0.9",
                           "exponent of the decay (Pet LR_POW), in (0, 100]"),
    KILN_OPTION_MIN_INIT("min_lr", KILN_OPT_FLOAT, 0.0, "0.0",
                         "floor of the decay, reached at max_iters + 1, in [0, base lr]"),
};

const kiln_component_descriptor kiln_lr_poly_component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "poly", KILN_VERSION_INIT(1, 0, 0),
    "Pet's POLY with a floor: min_lr + (base lr - min_lr) x max(0, 1 - (it - W - 1) / (max - "
    "W))^power for warm-up W, the base lr at the first iteration after warm-up; with min_lr = 0 "
    "it equals PyTorch's PolynomialLR(total_iters = max - W, power) started after the warm-up "
    "(SequentialLR with milestone W)",
    &kiln_lr_capabilities, poly_options, &poly_vtable);
