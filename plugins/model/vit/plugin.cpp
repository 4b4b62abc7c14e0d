// The kiln-vit plugin library: its descriptor, options schema and model factory.
#include <cmath>
#include <string>

#include "kiln/torch.hpp"
#include "vit.hpp"

namespace {

using kiln::Error;

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "patch_size", KILN_OPT_INT, 1, 0, 0, 1.0, 0.0, "4", nullptr,
     "side of the square patches; must divide the image height and width"},
    {sizeof(kiln_option_spec), "dim", KILN_OPT_INT, 1, 0, 0, 1.0, 0.0, "128", nullptr,
     "token width (embedding dimension); must be divisible by heads"},
    {sizeof(kiln_option_spec), "depth", KILN_OPT_INT, 1, 0, 0, 1.0, 0.0, "6", nullptr,
     "number of transformer blocks"},
    {sizeof(kiln_option_spec), "heads", KILN_OPT_INT, 1, 0, 0, 1.0, 0.0, "4", nullptr,
     "attention heads per block"},
    {sizeof(kiln_option_spec), "mlp_ratio", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "2.0", nullptr,
     "MLP hidden width as a multiple of dim (hidden = int(dim x mlp_ratio) >= 1)"},
    {sizeof(kiln_option_spec), "pool", KILN_OPT_STRING, 0, 0, 0, 0.0, 0.0, "\"cls\"", "cls,mean",
     "what the head reads: the class token (cls: timm's global_pool 'token') or the mean of the "
     "patch tokens, without a class token (mean: timm's class_token=False, global_pool='avg', "
     "fc_norm=False; the final norm runs before the pooling)"},
    {sizeof(kiln_option_spec), "dropout", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.0", nullptr,
     "dropout after the position embedding, attention projection and MLP layers, in [0, 1)"},
};

// Bounds that keep the parameter tensors' sizes far from int64 overflow.
constexpr int64_t kMaxWidth = int64_t{1} << 16;
constexpr int64_t kMaxDepth = 1024;

// The option `name` checked to be of `type`; NULL when absent (the default then applies).
const kiln_option_value* find_option(const kiln_options* options, const char* name, int32_t type) {
  return kiln::find_option(options, name, type, "vit");
}

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(KILN_ERR_INVALID_ARGUMENT, "vit: " + message);
}

kiln_vit::VitConfig resolve_config(const kiln_options* options, const kiln_model_input& input) {
  kiln_vit::VitConfig config;
  double mlp_ratio = 2.0;
  std::string pool = "cls";
  if (const kiln_option_value* v = find_option(options, "patch_size", KILN_OPT_INT)) {
    config.patch = v->int_value;
  }
  if (const kiln_option_value* v = find_option(options, "dim", KILN_OPT_INT)) {
    config.dim = v->int_value;
  }
  if (const kiln_option_value* v = find_option(options, "depth", KILN_OPT_INT)) {
    config.depth = v->int_value;
  }
  if (const kiln_option_value* v = find_option(options, "heads", KILN_OPT_INT)) {
    config.heads = v->int_value;
  }
  if (const kiln_option_value* v = find_option(options, "mlp_ratio", KILN_OPT_FLOAT)) {
    mlp_ratio = v->float_value;
  }
  if (const kiln_option_value* v = find_option(options, "pool", KILN_OPT_STRING)) {
    pool = v->string_value != nullptr ? v->string_value : "";
  }
  if (const kiln_option_value* v = find_option(options, "dropout", KILN_OPT_FLOAT)) {
    config.dropout = v->float_value;
  }
  require(input.struct_size >= KILN_SIZE_UP_TO(kiln_model_input, num_classes),
          "kiln_model_input is too small");
  require(input.channels >= 1 && input.height >= 1 && input.width >= 1 && input.num_classes >= 1,
          "input dimensions and classes must be >= 1");
  config.in_channels = input.channels;
  config.height = input.height;
  config.width = input.width;
  config.num_classes = input.num_classes;

  require(config.patch >= 1, "patch_size must be >= 1, not " + std::to_string(config.patch));
  require(input.height % config.patch == 0 && input.width % config.patch == 0,
          "patch_size " + std::to_string(config.patch) + " must divide the image size " +
              std::to_string(input.height) + "x" + std::to_string(input.width));
  require(
      config.dim >= 1 && config.dim <= kMaxWidth,
      "dim must be in [1, " + std::to_string(kMaxWidth) + "], not " + std::to_string(config.dim));
  require(config.depth >= 1 && config.depth <= kMaxDepth,
          "depth must be in [1, " + std::to_string(kMaxDepth) + "], not " +
              std::to_string(config.depth));
  require(config.heads >= 1, "heads must be >= 1, not " + std::to_string(config.heads));
  require(config.dim % config.heads == 0, "dim " + std::to_string(config.dim) +
                                              " must be divisible by heads " +
                                              std::to_string(config.heads));
  // int(dim · mlp_ratio) as Python (and timm) compute it: truncation toward zero.
  const double hidden = std::isfinite(mlp_ratio) ? std::trunc(config.dim * mlp_ratio) : -1.0;
  require(hidden >= 1.0 && hidden <= static_cast<double>(kMaxWidth),
          "mlp_ratio " + std::to_string(mlp_ratio) + " gives an MLP width outside [1, " +
              std::to_string(kMaxWidth) + "] for dim " + std::to_string(config.dim));
  config.hidden = static_cast<int64_t>(hidden);
  require(pool == "cls" || pool == "mean", "pool must be cls or mean, not '" + pool + "'");
  config.cls_pool = pool == "cls";
  // The schema's max is inclusive; p = 1 would zero every activation, so refuse it here.
  require(config.dropout >= 0.0 && config.dropout < 1.0, "dropout must be in [0, 1)");
  return config;
}

kiln_status* create(const kiln_host_api* host, const kiln_options* options,
                    const kiln_model_input* input, kiln_torch_module** out) {
  return KILN_GUARD(host, {
    if (input == nullptr || out == nullptr) {
      throw Error(KILN_ERR_INVALID_ARGUMENT, "vit: create needs an input and an out pointer");
    }
    *out = nullptr;
    auto model = std::make_shared<kiln_vit::Vit>(resolve_config(options, *input));
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
                                              "vit",
                                              {1, 0, 0},
                                              "Vision Transformer (timm's VisionTransformer)",
                                              &kCapabilities,
                                              sizeof(kOptions) / sizeof(kOptions[0]),
                                              kOptions,
                                              &kVtable};

const kiln_component_descriptor* const kComponents[] = {&kComponent};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-vit", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C KILN_EXPORT const kiln_plugin_descriptor* kiln_plugin_get(void) {
  return &kDescriptor;
}
