/* A model component that claims to be built against LibTorch 1.13.0 with the old C++ ABI: the
 * build defines KILN_PLUGIN_TORCH_VERSION and KILN_PLUGIN_TORCH_CXX11_ABI as kiln_add_plugin's
 * TORCH would for that LibTorch, and KILN_PLUGIN_DESCRIPTOR_INIT records them. */
#include "kiln/model.h"
#include "kiln/plugin.h"

static kiln_status* old_create(const kiln_host_api* host, const kiln_options* options,
                               const kiln_model_input* input, kiln_torch_module** out) {
  return host->make_status(KILN_ERR_INTERNAL, "bad_torch_mismatch must never be created");
}
static void old_destroy(kiln_torch_module* model) {}

static const kiln_model_vtable vtable = KILN_MODEL_VTABLE_INIT(old_create, old_destroy);
static const kiln_capabilities caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32);
static const kiln_component_descriptor component = KILN_COMPONENT_INIT(
    KILN_COMPONENT_MODEL, "old_torch_model", KILN_VERSION_INIT(1, 0, 0), NULL, &caps, &vtable);
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("bad-torch-mismatch", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
