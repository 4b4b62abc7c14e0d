/* A valid library whose init refuses to start. */
#include "tiny_optimizer.h"

static kiln_status* refuse_init(const kiln_host_api* host) {
  return host->make_status(KILN_ERR_FAILED_PRECONDITION, "init refused: no licence file");
}

static const kiln_optimizer_vtable vtable = {sizeof vtable, tiny_create, tiny_destroy, tiny_step};
static const kiln_component_descriptor component = {sizeof component,
                                                    KILN_COMPONENT_OPTIMIZER,
                                                    0,
                                                    "licensed_opt",
                                                    {1, 0, 0},
                                                    NULL,
                                                    &tiny_caps,
                                                    0,
                                                    NULL,
                                                    &vtable};
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor = {
    sizeof descriptor, KILN_ABI_MAJOR, KILN_ABI_MINOR, "bad-init", {1, 0, 0}, 1,
    components,        refuse_init,    NULL,           -1,         0};

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
