/* An optimizer whose option default does not parse as its type: refused at load, not in every
 * pipeline that uses it. */
#include "tiny_optimizer.h"

static const kiln_option_spec options[] = {
    KILN_OPTION_INIT("beta", KILN_OPT_FLOAT, "\"high\"", "a float with a string default")};
static const kiln_optimizer_vtable vtable =
    KILN_OPTIMIZER_VTABLE_INIT(tiny_create, tiny_destroy, tiny_step);
static const kiln_component_descriptor component =
    KILN_COMPONENT_OPTIONS_INIT(KILN_COMPONENT_OPTIMIZER, "bad_default_opt",
                                KILN_VERSION_INIT(1, 0, 0), NULL, &tiny_caps, options, &vtable);
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("bad_default", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
