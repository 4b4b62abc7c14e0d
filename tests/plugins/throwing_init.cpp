// A library whose init lets an exception out (`throw 42`): the loader must refuse it, with its
// path and "init threw int", and go on with the other libraries.
#include "kiln/optimizer.h"
#include "kiln/plugin.h"

namespace {

kiln_status* init_throws(const kiln_host_api*) { throw 42; }

int instance;
kiln_status* create(const kiln_host_api*, const kiln_options*, void** out) {
  *out = &instance;
  return nullptr;
}
void destroy(void*) {}
kiln_status* step(void*, kiln_call_context*, const kiln_param_group*) { return nullptr; }

const kiln_optimizer_vtable kVtable = KILN_OPTIMIZER_VTABLE_INIT(create, destroy, step);
const kiln_capabilities kCaps = {sizeof(kiln_capabilities),
                                 KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32, 0, nullptr};
const kiln_component_descriptor kComponent = {sizeof(kiln_component_descriptor),
                                              KILN_COMPONENT_OPTIMIZER,
                                              0,
                                              "init_throws_opt",
                                              {1, 0, 0},
                                              nullptr,
                                              &kCaps,
                                              0,
                                              nullptr,
                                              &kVtable};
const kiln_component_descriptor* const kComponents[] = {&kComponent};
const kiln_plugin_descriptor kDescriptor = {sizeof(kiln_plugin_descriptor),
                                            KILN_ABI_MAJOR,
                                            KILN_ABI_MINOR,
                                            "throwing-init",
                                            {1, 0, 0},
                                            1,
                                            kComponents,
                                            init_throws,
                                            nullptr,
                                            -1,
                                            0};

}  // namespace

extern "C" {
KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
}
