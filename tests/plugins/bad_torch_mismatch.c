/* A model component that claims to be built against LibTorch 1.13.0 with the old C++ ABI. */
#include "kiln/model.h"
#include "kiln/plugin.h"

static kiln_status* old_create(const kiln_host_api* host, const kiln_options* options,
                               const kiln_model_input* input, kiln_torch_module** out) {
  return host->make_status(KILN_ERR_INTERNAL, "bad_torch_mismatch must never be created");
}
static void old_destroy(kiln_torch_module* model) {}

static const kiln_model_vtable vtable = {sizeof vtable, old_create, old_destroy};
static const kiln_capabilities caps = {sizeof caps, KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32, 0,
                                       NULL};
static const kiln_component_descriptor component = {
    sizeof component, KILN_COMPONENT_MODEL, 0, "old_torch_model", {1, 0, 0}, NULL, &caps, 0, NULL,
    &vtable};
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor = {sizeof descriptor,
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR,
                                                  "bad-torch-mismatch",
                                                  {1, 0, 0},
                                                  1,
                                                  components,
                                                  NULL,
                                                  "1.13.0",
                                                  0,
                                                  0};

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
