/* The descriptor claims a struct_size smaller than KILN_PLUGIN_DESCRIPTOR_V1_SIZE. */
#include "tiny_optimizer.h"

static const kiln_optimizer_vtable vtable = {sizeof vtable, tiny_create, tiny_destroy, tiny_step};
static const kiln_component_descriptor component = {sizeof component,
                                                    KILN_COMPONENT_OPTIMIZER,
                                                    0,
                                                    "small_opt",
                                                    {1, 0, 0},
                                                    NULL,
                                                    &tiny_caps,
                                                    0,
                                                    NULL,
                                                    &vtable};
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor = {offsetof(kiln_plugin_descriptor, init),
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR,
                                                  "bad-struct-small",
                                                  {1, 0, 0},
                                                  1,
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
