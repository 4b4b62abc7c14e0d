/*
 * cosine — Pet's COSINE rescaled onto [min_lr, base_lr]:
 *   lr = min_lr + (base_lr − min_lr)·½·(1 + cos(π·(it − warm − 1)/(max − warm)))
 * so the first post-warm-up iteration gets base_lr. Equals PyTorch's CosineAnnealingLR
 * (T_max = max − warm, eta_min = min_lr) at last_epoch = it − warm − 1.
 */
#include <math.h>
#include <stdlib.h>

#include "lr_common.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

static const char kName[] = "cosine";

typedef struct cosine_policy {
  const kiln_host_api* host;
  double base_lr;
  double min_lr;
  int64_t warmup_iters;
  int64_t span; /* max_iters − warmup_iters, > 0 */
} cosine_policy;

static void cosine_destroy(void* instance) { free(instance); }

static kiln_status* cosine_create(const kiln_host_api* host, const kiln_options* options,
                                  const kiln_lr_schedule* schedule, void** out) {
  double min_lr = kiln_options_float(options, "min_lr", 0.0);
  cosine_policy* p;
  kiln_status* status;
  if ((status = kiln_lr_check_min_lr(host, kName, min_lr, schedule->base_lr)) != NULL) {
    return status;
  }
  if ((status = kiln_lr_check_span(host, kName, schedule)) != NULL) return status;
  p = (cosine_policy*)calloc(1, sizeof *p);
  if (p == NULL) return kiln_lr_out_of_memory(host, kName);
  p->host = host;
  p->base_lr = schedule->base_lr;
  p->min_lr = min_lr;
  p->warmup_iters = schedule->warmup_iters;
  p->span = schedule->max_iters - schedule->warmup_iters;
  *out = p;
  return NULL;
}

static kiln_status* cosine_lr_at(void* instance, int64_t iter, double* lr) {
  const cosine_policy* p = (const cosine_policy*)instance;
  kiln_status* status = kiln_lr_check_iter(p->host, kName, iter);
  double phase;
  if (status != NULL) return status;
  phase = (double)(iter - p->warmup_iters - 1) * M_PI / (double)p->span;
  *lr = p->min_lr + (p->base_lr - p->min_lr) * 0.5 * (1.0 + cos(phase));
  return NULL;
}

static const kiln_lr_policy_vtable cosine_vtable =
    KILN_LR_POLICY_VTABLE_INIT(cosine_create, cosine_destroy, cosine_lr_at);

static const kiln_option_spec cosine_options[] = {
    KILN_OPTION_MIN_INIT("min_lr", KILN_OPT_FLOAT, 0.0, "0.0",
                         "floor of the decay (eta_min), in [0, base lr]"),
};

const kiln_component_descriptor kiln_lr_cosine_component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "cosine", KILN_VERSION_INIT(1, 0, 0),
    "Pet's COSINE with a floor: min_lr + (base lr - min_lr) x (1 + cos(pi x (it - W - 1) / (max "
    "- W))) / 2 for warm-up W, the base lr at the first iteration after warm-up; equals "
    "PyTorch's CosineAnnealingLR(T_max = max - W, eta_min = min_lr) started after the warm-up "
    "(SequentialLR with milestone W)",
    &kiln_lr_capabilities, cosine_options, &cosine_vtable);
