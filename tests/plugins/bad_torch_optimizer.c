/* An optimizer (no model) whose library records LibTorch 1.13.0 with the old C++ ABI, as one
 * running ATen on host memory would: since ABI 1.6 the host checks the torch build of every
 * kind, so it is refused. The build defines the torch macros as for bad_torch_mismatch. */
#include "tiny_optimizer.h"

static const kiln_optimizer_vtable vtable =
    KILN_OPTIMIZER_VTABLE_INIT(tiny_create, tiny_destroy, tiny_step);
static const kiln_component_descriptor component =
    KILN_COMPONENT_INIT(KILN_COMPONENT_OPTIMIZER, "old_torch_opt", KILN_VERSION_INIT(1, 0, 0), NULL,
                        &tiny_caps, &vtable);
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor = KILN_PLUGIN_DESCRIPTOR_INIT(
    "bad-torch-optimizer", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
