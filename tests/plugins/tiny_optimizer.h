/* A do-nothing optimizer vtable shared by the broken test plugins, which the loader must refuse
 * (or, for bad_duplicate, accept only once) before anything is run. */
#ifndef KILN_TESTS_TINY_OPTIMIZER_H_
#define KILN_TESTS_TINY_OPTIMIZER_H_

#include "kiln/optimizer.h"
#include "kiln/plugin.h"

static int tiny_instance;

static kiln_status* tiny_create(const kiln_host_api* host, const kiln_options* options,
                                void** out) {
  *out = &tiny_instance;
  return NULL;
}
static void tiny_destroy(void* instance) {}
static kiln_status* tiny_step(void* instance, kiln_call_context* ctx,
                              const kiln_param_group* group) {
  return NULL;
}

static const kiln_capabilities tiny_caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32);

#endif /* KILN_TESTS_TINY_OPTIMIZER_H_ */
