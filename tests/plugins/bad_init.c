/* A valid library whose init refuses to start. */
#include "tiny_optimizer.h"

static kiln_status* refuse_init(const kiln_host_api* host) {
  return host->make_status(KILN_ERR_FAILED_PRECONDITION, "init refused: no licence file");
}

static const kiln_optimizer_vtable vtable =
    KILN_OPTIMIZER_VTABLE_INIT(tiny_create, tiny_destroy, tiny_step);
static const kiln_component_descriptor component =
    KILN_COMPONENT_INIT(KILN_COMPONENT_OPTIMIZER, "licensed_opt", KILN_VERSION_INIT(1, 0, 0), NULL,
                        &tiny_caps, &vtable);
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("bad-init", KILN_VERSION_INIT(1, 0, 0), components, refuse_init);

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
