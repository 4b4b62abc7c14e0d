/* Two components with the same name "dup_opt". */
#include "tiny_optimizer.h"

static const kiln_optimizer_vtable vtable =
    KILN_OPTIMIZER_VTABLE_INIT(tiny_create, tiny_destroy, tiny_step);
static const kiln_component_descriptor first = KILN_COMPONENT_INIT(
    KILN_COMPONENT_OPTIMIZER, "dup_opt", KILN_VERSION_INIT(1, 0, 0), NULL, &tiny_caps, &vtable);
static const kiln_component_descriptor second = KILN_COMPONENT_INIT(
    KILN_COMPONENT_OPTIMIZER, "dup_opt", KILN_VERSION_INIT(1, 1, 0), NULL, &tiny_caps, &vtable);
static const kiln_component_descriptor* const components[] = {&first, &second};
static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("bad-duplicate", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
