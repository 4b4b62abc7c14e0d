// The kiln-torchscript plugin library: a model written in Python, saved with torch.jit.save.
#include <string>

#include "kiln/torch.hpp"
#include "scripted.hpp"

namespace {

using kiln::Error;

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "path", KILN_OPT_STRING, 0, 0, 0, 0.0, 0.0, nullptr, nullptr,
     "file written by torch.jit.save (a scripted or traced module, its forward taking a batch "
     "N x C x H x W and giving logits N x classes); a relative path is from the folder kiln runs "
     "in"},
    {sizeof(kiln_option_spec), "optimize", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "false", nullptr,
     "let TorchScript's graph executor profile, specialise and fuse the forward (as "
     "torch.jit.load does in Python); false runs the graph op by op, as eager PyTorch"},
};

const kiln_option_value* find_option(const kiln_options* options, const char* name, int32_t type) {
  return kiln::find_option(options, name, type, "torchscript");
}

kiln_torchscript::ScriptedConfig parse_config(const kiln_options* options) {
  kiln_torchscript::ScriptedConfig config;
  if (const kiln_option_value* v = find_option(options, "path", KILN_OPT_STRING)) {
    config.path = v->string_value != nullptr ? v->string_value : "";
  }
  if (const kiln_option_value* v = find_option(options, "optimize", KILN_OPT_BOOL)) {
    config.optimize = v->bool_value != 0;
  }
  return config;
}

kiln_status* create(const kiln_host_api* host, const kiln_options* options,
                    const kiln_model_input* input, kiln_torch_module** out) {
  return KILN_GUARD(host, {
    if (input == nullptr || out == nullptr) {
      throw Error(KILN_ERR_INVALID_ARGUMENT,
                  "torchscript: create needs an input and an out pointer");
    }
    *out = nullptr;
    if (input->struct_size < KILN_SIZE_UP_TO(kiln_model_input, num_classes)) {
      throw Error(KILN_ERR_INVALID_ARGUMENT, "torchscript: kiln_model_input is too small");
    }
    if (input->channels < 1 || input->height < 1 || input->width < 1 || input->num_classes < 1) {
      throw Error(KILN_ERR_INVALID_ARGUMENT,
                  "torchscript: input dimensions and classes must be >= 1");
    }
    *out = kiln::release_model(kiln_torchscript::load_scripted(parse_config(options), *input));
  });
}

const kiln_capabilities kCapabilities = {sizeof(kiln_capabilities),
                                         KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA |
                                             KILN_CAP_DTYPE_F32 | KILN_CAP_DTYPE_F16 |
                                             KILN_CAP_DTYPE_BF16 | KILN_CAP_DTYPE_F64,
                                         0, nullptr};

const kiln_model_vtable kVtable = KILN_MODEL_VTABLE_INIT(&create, &kiln::destroy_model_handle);

const kiln_component_descriptor kComponent = {
    sizeof(kiln_component_descriptor),
    KILN_COMPONENT_MODEL,
    0,
    "torchscript",
    {1, 0, 0},
    "a model written in Python: a TorchScript file (torch.jit.save) trained as it is",
    &kCapabilities,
    sizeof(kOptions) / sizeof(kOptions[0]),
    kOptions,
    &kVtable};

const kiln_component_descriptor* const kComponents[] = {&kComponent};

const kiln_plugin_descriptor kDescriptor = KILN_PLUGIN_DESCRIPTOR_INIT(
    "kiln-torchscript", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C KILN_EXPORT const kiln_plugin_descriptor* kiln_plugin_get(void) {
  return &kDescriptor;
}
