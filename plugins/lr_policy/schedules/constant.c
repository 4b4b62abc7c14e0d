/* constant — the base learning rate after warm-up, unchanged. */
#include <stdlib.h>

#include "lr_common.h"

static const char kName[] = "constant";

typedef struct constant_policy {
  const kiln_host_api* host;
  double base_lr;
} constant_policy;

static void constant_destroy(void* instance) { free(instance); }

static kiln_status* constant_create(const kiln_host_api* host, const kiln_options* options,
                                    const kiln_lr_schedule* schedule, void** out) {
  constant_policy* p = (constant_policy*)calloc(1, sizeof *p);
  (void)options;
  if (p == NULL) return kiln_lr_out_of_memory(host, kName);
  p->host = host;
  p->base_lr = schedule->base_lr;
  *out = p;
  return NULL;
}

static kiln_status* constant_lr_at(void* instance, int64_t iter, double* lr) {
  const constant_policy* p = (const constant_policy*)instance;
  kiln_status* status = kiln_lr_check_iter(p->host, kName, iter);
  if (status != NULL) return status;
  *lr = p->base_lr;
  return NULL;
}

static const kiln_lr_policy_vtable constant_vtable =
    KILN_LR_POLICY_VTABLE_INIT(constant_create, constant_destroy, constant_lr_at);

const kiln_component_descriptor kiln_lr_constant_component =
    KILN_COMPONENT_INIT(KILN_COMPONENT_LR_POLICY, "constant", KILN_VERSION_INIT(1, 0, 0),
                        "the base lr after warm-up (Pet's and PyTorch's constant rate)",
                        &kiln_lr_capabilities, &constant_vtable);
