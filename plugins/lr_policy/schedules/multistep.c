/*
 * multistep — PyTorch's MultiStepLR stepped once per iteration: the step at iteration it runs at
 * torch's last_epoch = it − 1, so lr·gamma^(milestones <= it − 1) and milestone m first shows at
 * iteration m + 1. A milestone listed twice counts twice (MultiStepLR keeps a Counter).
 * Iterations count from the start of the run. With by_epoch the milestones are m·iters_per_epoch,
 * which is MultiStepLR stepped once per epoch: the decay starts with epoch m + 1 (1-based).
 * Until 2.0 the milestone m itself was decayed (Pet's STEP, which `step` with `steps` keeps).
 */
#include <math.h>
#include <stdlib.h>

#include "lr_common.h"

static const char kName[] = "multistep";

typedef struct multistep_policy {
  const kiln_host_api* host;
  double base_lr;
  double gamma;
  size_t milestone_count;
  int64_t* milestones; /* iterations, non-decreasing, positive */
} multistep_policy;

static void multistep_destroy(void* instance) {
  multistep_policy* p = (multistep_policy*)instance;
  if (p == NULL) return;
  free(p->milestones);
  free(p);
}

static kiln_status* multistep_create(const kiln_host_api* host, const kiln_options* options,
                                     const kiln_lr_schedule* schedule, void** out) {
  double gamma = kiln_options_float(options, "gamma", 0.1);
  int64_t scale = 1;
  int64_t* milestones = NULL;
  size_t count = 0;
  multistep_policy* p;
  kiln_status* status;

  if ((status = kiln_lr_check_gamma(host, kName, gamma)) != NULL) return status;
  if (kiln_options_find(options, "milestones") == NULL) {
    return kiln_lr_invalid(host, kName, "milestones is required");
  }
  if ((status = kiln_lr_duration_scale(host, kName, options, schedule, &scale)) != NULL) {
    return status;
  }
  status =
      kiln_lr_read_boundaries(host, kName, options, "milestones", 1, scale, &milestones, &count);
  if (status != NULL) return status;

  p = (multistep_policy*)calloc(1, sizeof *p);
  if (p == NULL) {
    free(milestones);
    return kiln_lr_out_of_memory(host, kName);
  }
  p->host = host;
  p->base_lr = schedule->base_lr;
  p->gamma = gamma;
  p->milestone_count = count;
  p->milestones = milestones;
  *out = p;
  return NULL;
}

static kiln_status* multistep_lr_at(void* instance, int64_t iter, double* lr) {
  const multistep_policy* p = (const multistep_policy*)instance;
  kiln_status* status = kiln_lr_check_iter(p->host, kName, iter);
  if (status != NULL) return status;
  *lr = p->base_lr *
        pow(p->gamma, (double)kiln_lr_bisect_right(p->milestones, p->milestone_count, iter - 1));
  return NULL;
}

static const kiln_lr_policy_vtable multistep_vtable =
    KILN_LR_POLICY_VTABLE_INIT(multistep_create, multistep_destroy, multistep_lr_at);

static const kiln_option_spec multistep_options[] = {
    KILN_OPTION_MIN_INIT(
        "milestones", KILN_OPT_INT_LIST, 1.0, NULL,
        "iterations (epochs with by_epoch) after which lr is multiplied by gamma: iteration m + 1 "
        "(the first of epoch m + 1) is the first at the lower rate; non-decreasing"),
    KILN_OPTION_RANGE_INIT("gamma", KILN_OPT_FLOAT, 0.0, 1.0, "0.1",
                           "factor applied at each milestone, in (0, 1]"),
    KILN_OPTION_INIT("by_epoch", KILN_OPT_BOOL, "false",
                     "milestones are in epochs, converted with the iterations per epoch"),
};

const kiln_component_descriptor kiln_lr_multistep_component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "multistep", KILN_VERSION_INIT(2, 0, 0),
    "PyTorch's MultiStepLR stepped every iteration (with by_epoch: every epoch): lr x gamma^(how "
    "many milestones are < it), counting from the start of the run, warm-up included. Changed in "
    "2.0: 1.x decayed at iteration m itself, Pet's STEP, which step with steps still is",
    &kiln_lr_capabilities, multistep_options, &multistep_vtable);
