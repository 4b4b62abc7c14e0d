// kiln_classic — two older methods of torch.optim as optimizers: "asgd" (torch.optim.ASGD,
// averaged SGD) and "rprop" (torch.optim.Rprop, resilient backpropagation), each over the whole
// group per call with ATen's multi-tensor (_foreach) ops.
#include "classic/components.hpp"
#include "kiln/sdk.hpp"

namespace {

const kiln_component_descriptor* const kComponents[] = {&kiln::classic::kAsgd,
                                                        &kiln::classic::kRprop};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-classic", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
