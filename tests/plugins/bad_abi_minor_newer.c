/* Built against a newer minor ABI than the host knows (KILN_ABI_MINOR + 1). */
#include "tiny_optimizer.h"

static const kiln_optimizer_vtable vtable = {sizeof vtable, tiny_create, tiny_destroy, tiny_step};
static const kiln_component_descriptor component = {sizeof component,
                                                    KILN_COMPONENT_OPTIMIZER,
                                                    0,
                                                    "newer_opt",
                                                    {1, 0, 0},
                                                    NULL,
                                                    &tiny_caps,
                                                    0,
                                                    NULL,
                                                    &vtable};
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor = {sizeof descriptor,
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR + 1,
                                                  "bad-abi-minor-newer",
                                                  {1, 0, 0},
                                                  1,
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};

KILN_EXPORT uint32_t kiln_plugin_abi(void) {
  return KILN_ABI_PACK(KILN_ABI_MAJOR, KILN_ABI_MINOR + 1);
}
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
