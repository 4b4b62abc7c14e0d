// kiln_datasets — the built-in dataset formats other than image folders: idx (and
// fashion-mnist), cifar10, cifar100, tensors, synthetic. Plain C++, no LibTorch.
#include "common.hpp"

namespace {

const kiln_component_descriptor* const kComponents[] = {
    &kiln::datasets::kIdxComponent,     &kiln::datasets::kFashionMnistComponent,
    &kiln::datasets::kCifar10Component, &kiln::datasets::kCifar100Component,
    &kiln::datasets::kTensorsComponent, &kiln::datasets::kSyntheticComponent};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-datasets", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
