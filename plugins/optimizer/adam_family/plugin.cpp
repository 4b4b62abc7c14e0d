// kiln_adam_family — the Adam variants of torch.optim as three optimizers: "nadam"
// (torch.optim.NAdam), "radam" (torch.optim.RAdam) and "adamax" (torch.optim.Adamax), each over
// the whole group per call with ATen's multi-tensor (_foreach) ops in the order of torch's
// _multi_tensor_* path.
#include "adam_family/components.hpp"
#include "kiln/sdk.hpp"

namespace {

const kiln_component_descriptor* const kComponents[] = {
    &kiln::adam_family::kNAdam, &kiln::adam_family::kRAdam, &kiln::adam_family::kAdamax};

const kiln_plugin_descriptor kDescriptor = KILN_PLUGIN_DESCRIPTOR_INIT(
    "kiln-adam-family", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
