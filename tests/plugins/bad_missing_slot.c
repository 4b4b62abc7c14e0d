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

static const kiln_optimizer_vtable vtable =
    KILN_OPTIMIZER_VTABLE_INIT(stepless_create, stepless_destroy, NULL);
static const kiln_capabilities caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32);
static const kiln_component_descriptor component = KILN_COMPONENT_INIT(
    KILN_COMPONENT_OPTIMIZER, "no_step_opt", KILN_VERSION_INIT(1, 0, 0), NULL, &caps, &vtable);
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("bad-missing-slot", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
