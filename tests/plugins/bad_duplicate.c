/* Two components with the same name "dup_opt". */
#include "tiny_optimizer.h"

static const kiln_optimizer_vtable vtable = {sizeof vtable, tiny_create, tiny_destroy, tiny_step};
static const kiln_component_descriptor first = {
    sizeof first, KILN_COMPONENT_OPTIMIZER, 0, "dup_opt", {1, 0, 0}, NULL, &tiny_caps, 0, NULL,
    &vtable};
static const kiln_component_descriptor second = {
    sizeof second, KILN_COMPONENT_OPTIMIZER, 0, "dup_opt", {1, 1, 0}, NULL, &tiny_caps, 0, NULL,
    &vtable};
static const kiln_component_descriptor* const components[] = {&first, &second};
static const kiln_plugin_descriptor descriptor = {sizeof descriptor,
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR,
                                                  "bad-duplicate",
                                                  {1, 0, 0},
                                                  2,
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
