/*
 * exp — PyTorch's ExponentialLR stepped once per iteration (Caffe's "exp", whose iterations count
 * from 0): lr = base_lr·gamma^(it − 1), so iteration 1 trains at base_lr as torch's first step
 * does. Iterations count from the start of the run, warm-up included. Until 2.0 this was
 * gamma^it, one iteration ahead of torch.
 */
#include <math.h>
#include <stdlib.h>

#include "lr_common.h"

static const char kName[] = "exp";

typedef struct exp_policy {
  const kiln_host_api* host;
  double base_lr;
  double gamma;
} exp_policy;

static void exp_destroy(void* instance) { free(instance); }

static kiln_status* exp_create(const kiln_host_api* host, const kiln_options* options,
                               const kiln_lr_schedule* schedule, void** out) {
  exp_policy* p;
  kiln_status* status;
  if (kiln_options_find(options, "gamma") == NULL) {
    return kiln_lr_invalid(host, kName, "gamma is required");
  }
  if ((status = kiln_lr_check_gamma(host, kName, kiln_options_float(options, "gamma", 0.0))) !=
      NULL) {
    return status;
  }
  p = (exp_policy*)calloc(1, sizeof *p);
  if (p == NULL) return kiln_lr_out_of_memory(host, kName);
  p->host = host;
  p->base_lr = schedule->base_lr;
  p->gamma = kiln_options_float(options, "gamma", 0.0);
  *out = p;
  return NULL;
}

static kiln_status* exp_lr_at(void* instance, int64_t iter, double* lr) {
  const exp_policy* p = (const exp_policy*)instance;
  kiln_status* status = kiln_lr_check_iter(p->host, kName, iter);
  if (status != NULL) return status;
  *lr = p->base_lr * pow(p->gamma, (double)(iter - 1));
  return NULL;
}

static const kiln_lr_policy_vtable exp_vtable =
    KILN_LR_POLICY_VTABLE_INIT(exp_create, exp_destroy, exp_lr_at);

static const kiln_option_spec exp_options[] = {
    KILN_OPTION_RANGE_INIT("gamma", KILN_OPT_FLOAT, 0.0, 1.0, NULL,
                           "factor applied every iteration, in (0, 1]"),
};

const kiln_component_descriptor kiln_lr_exp_component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "exp", KILN_VERSION_INIT(2, 0, 0),
    "PyTorch's ExponentialLR stepped every iteration (Caffe's exp): lr x gamma^(it - 1), the "
    "first iteration at the base lr, counting from the start of the run, warm-up included (so "
    "after warm-up the rate is what it would have been without it). Changed in 2.0: 1.x trained "
    "iteration it at lr x gamma^it, one iteration ahead of ExponentialLR",
    &kiln_lr_capabilities, exp_options, &exp_vtable);
