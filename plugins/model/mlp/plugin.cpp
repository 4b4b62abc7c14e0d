// The kiln-mlp plugin library: its descriptor, options schema and model factory.
#include <string>
#include <vector>

#include "kiln/torch.hpp"
#include "mlp.hpp"

namespace {

using kiln::Error;

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "hidden", KILN_OPT_INT_LIST, 1, 0, 0, 1.0, 0.0, "[256, 128]",
     nullptr, "widths of the hidden layers (an empty list gives a linear classifier)"},
    {sizeof(kiln_option_spec), "dropout", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.0", nullptr,
     "dropout probability after each hidden activation, in [0, 1)"},
    {sizeof(kiln_option_spec), "norm_layers", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "false", nullptr,
     "put the pipeline's norm layer (with relu) after each hidden linear instead of a relu"},
};

// The option `name` checked to be of `type`; NULL when absent (the default then applies).
const kiln_option_value* find_option(const kiln_options* options, const char* name, int32_t type) {
  return kiln::find_option(options, name, type, "mlp");
}

kiln_mlp::MlpConfig parse_config(const kiln_options* options, const kiln_model_input& input) {
  kiln_mlp::MlpConfig config;
  config.hidden = {256, 128};
  if (const kiln_option_value* v = find_option(options, "hidden", KILN_OPT_INT_LIST)) {
    config.hidden.assign(v->int_list, v->int_list + v->list_length);
  }
  if (const kiln_option_value* v = find_option(options, "dropout", KILN_OPT_FLOAT)) {
    config.dropout = v->float_value;
  }
  if (const kiln_option_value* v = find_option(options, "norm_layers", KILN_OPT_BOOL)) {
    config.norm = v->bool_value != 0;
  }
  for (int64_t width : config.hidden) {
    if (width < 1) throw Error(KILN_ERR_INVALID_ARGUMENT, "mlp: hidden widths must be >= 1");
  }
  // The schema's max is inclusive; p = 1 would zero every activation, so refuse it here.
  if (!(config.dropout >= 0.0 && config.dropout < 1.0)) {
    throw Error(KILN_ERR_INVALID_ARGUMENT, "mlp: dropout must be in [0, 1)");
  }
  if (input.struct_size < KILN_SIZE_UP_TO(kiln_model_input, num_classes)) {
    throw Error(KILN_ERR_INVALID_ARGUMENT, "mlp: kiln_model_input is too small");
  }
  if (input.channels < 1 || input.height < 1 || input.width < 1 || input.num_classes < 1) {
    throw Error(KILN_ERR_INVALID_ARGUMENT, "mlp: input dimensions and classes must be >= 1");
  }
  config.in_features = input.channels * input.height * input.width;
  config.num_classes = input.num_classes;
  return config;
}

kiln_status* create(const kiln_host_api* host, const kiln_options* options,
                    const kiln_model_input* input, kiln_torch_module** out) {
  return KILN_GUARD(host, {
    if (input == nullptr || out == nullptr) {
      throw Error(KILN_ERR_INVALID_ARGUMENT, "mlp: create needs an input and an out pointer");
    }
    *out = nullptr;
    auto model = std::make_shared<kiln_mlp::Mlp>(kiln::NormSource(host, input),
                                                 parse_config(options, *input));
    *out = kiln::release_model(std::move(model));
  });
}

const kiln_capabilities kCapabilities = {sizeof(kiln_capabilities),
                                         KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA |
                                             KILN_CAP_DTYPE_F32 | KILN_CAP_DTYPE_F16 |
                                             KILN_CAP_DTYPE_BF16 | KILN_CAP_DTYPE_F64,
                                         0, nullptr};

const kiln_model_vtable kVtable = KILN_MODEL_VTABLE_INIT(&create, &kiln::destroy_model_handle);

const kiln_component_descriptor kComponent = {sizeof(kiln_component_descriptor),
                                              KILN_COMPONENT_MODEL,
                                              0,
                                              "mlp",
                                              {1, 0, 0},
                                              "fully connected classifier over flattened images",
                                              &kCapabilities,
                                              sizeof(kOptions) / sizeof(kOptions[0]),
                                              kOptions,
                                              &kVtable};

const kiln_component_descriptor* const kComponents[] = {&kComponent};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-mlp", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C KILN_EXPORT const kiln_plugin_descriptor* kiln_plugin_get(void) {
  return &kDescriptor;
}
