/* An optimizer whose option default does not parse as its type: refused at load, not in every
 * pipeline that uses it. */
#include "tiny_optimizer.h"

static const kiln_option_spec options[] = {{sizeof(kiln_option_spec), "beta", KILN_OPT_FLOAT, 0, 0,
                                            0, 0.0, 0.0, "\"high\"", NULL,
                                            "a float with a string default"}};
static const kiln_optimizer_vtable vtable = {sizeof vtable, tiny_create, tiny_destroy, tiny_step};
static const kiln_component_descriptor component = {sizeof component,
                                                    KILN_COMPONENT_OPTIMIZER,
                                                    0,
                                                    "bad_default_opt",
                                                    {1, 0, 0},
                                                    NULL,
                                                    &tiny_caps,
                                                    1,
                                                    options,
                                                    &vtable};
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor = {sizeof descriptor,
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR,
                                                  "bad_default",
                                                  {1, 0, 0},
                                                  1,
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
