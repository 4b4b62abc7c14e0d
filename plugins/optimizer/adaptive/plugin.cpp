// kiln_adaptive — the per-coordinate adaptive methods of torch.optim as three optimizers:
// "adagrad" (torch.optim.Adagrad), "adadelta" (torch.optim.Adadelta) and "adafactor"
// (torch.optim.Adafactor), each over the whole group per call with ATen's multi-tensor
// (_foreach) ops in the order of torch's _multi_tensor_* path.
#include "adaptive/components.hpp"
#include "kiln/sdk.hpp"

namespace {

const kiln_component_descriptor* const kComponents[] = {
    &kiln::adaptive::kAdagrad, &kiln::adaptive::kAdadelta, &kiln::adaptive::kAdafactor};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-adaptive", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
