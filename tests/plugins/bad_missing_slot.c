/* An optimizer whose required `step` slot is NULL. */
#include "kiln/optimizer.h"
#include "kiln/plugin.h"

static int instance;

static kiln_status* stepless_create(const kiln_host_api* host, const kiln_options* options,
                                    void** out) {
  *out = &instance;
  return NULL;
}
static void stepless_destroy(void* unused) {}

static const kiln_optimizer_vtable vtable = {sizeof vtable, stepless_create, stepless_destroy,
                                             NULL};
static const kiln_capabilities caps = {sizeof caps, KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32, 0,
                                       NULL};
static const kiln_component_descriptor component = {
    sizeof component, KILN_COMPONENT_OPTIMIZER, 0, "no_step_opt", {1, 0, 0}, NULL, &caps, 0, NULL,
    &vtable};
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor = {sizeof descriptor,
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR,
                                                  "bad-missing-slot",
                                                  {1, 0, 0},
                                                  1,
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
