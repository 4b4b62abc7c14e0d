/* A component descriptor whose struct_size stops before its vtable field. */
#include "tiny_optimizer.h"

static const kiln_optimizer_vtable vtable = {sizeof vtable, tiny_create, tiny_destroy, tiny_step};
static const kiln_component_descriptor component = {offsetof(kiln_component_descriptor, vtable),
                                                    KILN_COMPONENT_OPTIMIZER,
                                                    0,
                                                    "small_component",
                                                    {1, 0, 0},
                                                    NULL,
                                                    &tiny_caps,
                                                    0,
                                                    NULL,
                                                    &vtable};
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor = {sizeof descriptor,
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR,
                                                  "bad-component-small",
                                                  {1, 0, 0},
                                                  1,
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
