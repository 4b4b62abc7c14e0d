/* An optimizer declaring an option named like a key the host owns in [optimizer] (weight_decay):
 * the loader refuses it, since the host would never pass it on. */
#include "tiny_optimizer.h"

static const kiln_option_spec options[] = {
    KILN_OPTION_INIT("weight_decay", KILN_OPT_FLOAT, "0.0", "the host owns this key")};
static const kiln_optimizer_vtable vtable =
    KILN_OPTIMIZER_VTABLE_INIT(tiny_create, tiny_destroy, tiny_step);
static const kiln_component_descriptor component =
    KILN_COMPONENT_OPTIONS_INIT(KILN_COMPONENT_OPTIMIZER, "decaying_opt",
                                KILN_VERSION_INIT(1, 0, 0), NULL, &tiny_caps, options, &vtable);
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor = KILN_PLUGIN_DESCRIPTOR_INIT(
    "bad_reserved_option", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
