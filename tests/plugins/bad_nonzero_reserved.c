/* A library with one reserved field set to 7, the rest well formed. The build compiles it three
 * times: RESERVED_IN 1 sets the plugin descriptor's, 2 the component descriptor's, 3 an option
 * spec's. The host refuses each, naming the struct. */
#include "tiny_optimizer.h"

#ifndef RESERVED_IN
#error "define RESERVED_IN (1: plugin descriptor, 2: component, 3: option)"
#endif

static kiln_option_spec options[] = {
    KILN_OPTION_RANGE_INIT("beta", KILN_OPT_FLOAT, 0.0, 1.0, "0.5", "a well-formed option")};
static const kiln_optimizer_vtable vtable =
    KILN_OPTIMIZER_VTABLE_INIT(tiny_create, tiny_destroy, tiny_step);
static kiln_component_descriptor component =
    KILN_COMPONENT_OPTIONS_INIT(KILN_COMPONENT_OPTIMIZER, "reserved_opt",
                                KILN_VERSION_INIT(1, 0, 0), NULL, &tiny_caps, options, &vtable);
static const kiln_component_descriptor* const components[] = {&component};
static kiln_plugin_descriptor descriptor = KILN_PLUGIN_DESCRIPTOR_INIT(
    "bad-nonzero-reserved", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) {
#if RESERVED_IN == 1
  descriptor.reserved = 7;
#elif RESERVED_IN == 2
  component.reserved = 7;
#else
  options[0].reserved = 7;
#endif
  return &descriptor;
}
