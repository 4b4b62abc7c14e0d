// The kiln-resnet plugin library: its descriptor, options schema and model factory.
#include <cmath>
#include <string>
#include <vector>

#include "kiln/torch.hpp"
#include "resnet.hpp"

namespace {

using kiln::Error;

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "depth", KILN_OPT_STRING, 0, 0, 0, 0.0, 0.0, "\"small\"",
     "small,18,34,50,101,152",
     "small: CIFAR-style for 28/32-pixel images; 18, 34, 50, 101, 152: torchvision's "
     "ResNet-18 ... ResNet-152 with its parameter names and shapes (with its conv7x7/2 + maxpool "
     "stem, see stem, its weights load with model.init)"},
    {sizeof(kiln_option_spec), "stem", KILN_OPT_STRING, 0, 0, 0, 0.0, 0.0, "\"auto\"",
     "auto,imagenet,cifar",
     "imagenet: torchvision's conv7x7/2 + maxpool (4x smaller); cifar: a conv3x3/1 that keeps "
     "the resolution; auto: imagenet for depth 18 ... 152 on images of 64 pixels and more, else "
     "cifar"},
    {sizeof(kiln_option_spec), "width", KILN_OPT_INT, 1, 0, 0, 1.0, 0.0, "16", nullptr,
     "channels of the first stage for depth small (18 ... 152 use 64)"},
    {sizeof(kiln_option_spec), "blocks", KILN_OPT_INT_LIST, 1, 0, 0, 1.0, 0.0, "[1, 1, 1]", nullptr,
     "BasicBlocks per stage for depth small; ignored for 18 ... 152"},
    {sizeof(kiln_option_spec), "activation", KILN_OPT_STRING, 0, 0, 0, 0.0, 0.0, "\"relu\"",
     "relu,leaky_relu,elu",
     "activation after each norm layer and residual sum; the norm layer is asked to apply it "
     "(InPlace-ABN fuses it and needs leaky_relu or elu)"},
    {sizeof(kiln_option_spec), "activation_param", KILN_OPT_FLOAT, 0, 0, 0, 0.0, 0.0, "nan",
     nullptr, "leaky_relu slope or elu alpha; nan = 0.01 (InPlace-ABN's slope) or 1.0"},
    {sizeof(kiln_option_spec), "preact", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "false", nullptr,
     "pre-activation BasicBlocks (ResNet v2: norm, act, conv) with a final norm; depth small, 18 "
     "or 34"},
};

// Widest channel count a small ResNet may reach; guards width·2^stages against overflow.
constexpr int64_t kMaxChannels = int64_t{1} << 20;

// The option `name` checked to be of `type`; NULL when absent (the default then applies).
const kiln_option_value* find_option(const kiln_options* options, const char* name, int32_t type) {
  return kiln::find_option(options, name, type, "resnet");
}

// The options as given, defaults filled.
struct Options {
  std::string depth = "small";
  std::string stem = "auto";
  int64_t width = 16;
  std::vector<int64_t> blocks = {1, 1, 1};
  std::string activation = "relu";
  double activation_param = std::nan("");
  bool preact = false;
};

std::string string_option(const kiln_options* options, const char* name, std::string fallback) {
  const kiln_option_value* v = find_option(options, name, KILN_OPT_STRING);
  if (v == nullptr) return fallback;
  return v->string_value != nullptr ? v->string_value : "";
}

Options read_options(const kiln_options* options) {
  Options o;
  o.depth = string_option(options, "depth", o.depth);
  o.stem = string_option(options, "stem", o.stem);
  o.activation = string_option(options, "activation", o.activation);
  if (const kiln_option_value* v = find_option(options, "width", KILN_OPT_INT)) {
    o.width = v->int_value;
  }
  if (const kiln_option_value* v = find_option(options, "blocks", KILN_OPT_INT_LIST)) {
    o.blocks.assign(v->int_list, v->int_list + v->list_length);
  }
  if (const kiln_option_value* v = find_option(options, "activation_param", KILN_OPT_FLOAT)) {
    o.activation_param = v->float_value;
  }
  if (const kiln_option_value* v = find_option(options, "preact", KILN_OPT_BOOL)) {
    o.preact = v->bool_value != 0;
  }
  if (o.stem != "auto" && o.stem != "imagenet" && o.stem != "cifar") {
    throw Error(KILN_ERR_INVALID_ARGUMENT,
                "resnet: stem must be auto, imagenet or cifar, not '" + o.stem + "'");
  }
  return o;
}

kiln_resnet::Activation activation_of(const Options& o) {
  if (o.activation == "relu") return {KILN_ACT_RELU, 0.0};
  if (o.activation == "leaky_relu") {
    return {KILN_ACT_LEAKY_RELU, std::isnan(o.activation_param) ? 0.01 : o.activation_param};
  }
  if (o.activation == "elu") {
    return {KILN_ACT_ELU, std::isnan(o.activation_param) ? 1.0 : o.activation_param};
  }
  throw Error(KILN_ERR_INVALID_ARGUMENT,
              "resnet: activation must be relu, leaky_relu or elu, not '" + o.activation + "'");
}

// depth small: `width` channels doubling per stage, `blocks` BasicBlocks in each.
void resolve_small(const Options& o, kiln_resnet::ResNetConfig& config) {
  if (o.width < 1) throw Error(KILN_ERR_INVALID_ARGUMENT, "resnet: width must be >= 1");
  if (o.blocks.empty()) {
    throw Error(KILN_ERR_INVALID_ARGUMENT, "resnet: depth small needs at least one stage");
  }
  int64_t planes = o.width;
  for (size_t i = 0; i < o.blocks.size(); ++i) {
    if (o.blocks[i] < 1) throw Error(KILN_ERR_INVALID_ARGUMENT, "resnet: blocks must be >= 1");
    if (i > 0) planes *= 2;
    if (planes > kMaxChannels) {
      throw Error(KILN_ERR_INVALID_ARGUMENT, "resnet: width·2^(stages-1) is too large");
    }
    config.planes.push_back(planes);
  }
  config.blocks = o.blocks;
  config.stem_width = o.width;
  config.imagenet_stem = o.stem == "imagenet";
}

// torchvision's resnet18 … resnet152: blocks per stage, Bottlenecks from 50 on.
void resolve_torchvision(const Options& o, int64_t height, kiln_resnet::ResNetConfig& config) {
  const struct {
    const char* depth;
    std::vector<int64_t> blocks;
    bool bottleneck;
  } kDepths[] = {{"18", {2, 2, 2, 2}, false},
                 {"34", {3, 4, 6, 3}, false},
                 {"50", {3, 4, 6, 3}, true},
                 {"101", {3, 4, 23, 3}, true},
                 {"152", {3, 8, 36, 3}, true}};
  bool known = false;
  for (const auto& d : kDepths) {
    if (o.depth != d.depth) continue;
    known = true;
    config.blocks = d.blocks;
    config.bottleneck = d.bottleneck;
  }
  if (!known) {
    throw Error(KILN_ERR_INVALID_ARGUMENT,
                "resnet: depth must be small, 18, 34, 50, 101 or 152, not '" + o.depth + "'");
  }
  if (o.preact && config.bottleneck) {
    throw Error(KILN_ERR_INVALID_ARGUMENT, "resnet: preact = true builds BasicBlocks; depth " +
                                               o.depth +
                                               " uses Bottlenecks (use depth small, 18 or 34)");
  }
  config.planes = {64, 128, 256, 512};
  config.stem_width = 64;
  // The ImageNet stem shrinks 4× up front; small images keep their resolution instead, unless
  // asked (torchvision's weights at 32 pixels: its conv1 is 7×7).
  config.imagenet_stem = o.stem == "imagenet" || (o.stem == "auto" && height >= 64);
}

kiln_resnet::ResNetConfig resolve_config(const kiln_options* options,
                                         const kiln_model_input& input) {
  const Options o = read_options(options);
  if (input.struct_size < KILN_SIZE_UP_TO(kiln_model_input, num_classes)) {
    throw Error(KILN_ERR_INVALID_ARGUMENT, "resnet: kiln_model_input is too small");
  }
  if (input.channels < 1 || input.height < 1 || input.width < 1 || input.num_classes < 1) {
    throw Error(KILN_ERR_INVALID_ARGUMENT, "resnet: input dimensions and classes must be >= 1");
  }
  kiln_resnet::ResNetConfig config;
  config.in_channels = input.channels;
  config.num_classes = input.num_classes;
  config.preact = o.preact;
  config.activation = activation_of(o);
  if (o.depth == "small") {
    resolve_small(o, config);
  } else {
    resolve_torchvision(o, input.height, config);
  }
  return config;
}

kiln_status* create(const kiln_host_api* host, const kiln_options* options,
                    const kiln_model_input* input, kiln_torch_module** out) {
  return KILN_GUARD(host, {
    if (input == nullptr || out == nullptr) {
      throw Error(KILN_ERR_INVALID_ARGUMENT, "resnet: create needs an input and an out pointer");
    }
    *out = nullptr;
    auto model = std::make_shared<kiln_resnet::ResNet>(kiln::NormSource(host, input),
                                                       resolve_config(options, *input));
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
                                              "resnet",
                                              {1, 0, 0},
                                              "residual network (small, or torchvision's 18-152)",
                                              &kCapabilities,
                                              sizeof(kOptions) / sizeof(kOptions[0]),
                                              kOptions,
                                              &kVtable};

const kiln_component_descriptor* const kComponents[] = {&kComponent};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-resnet", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C KILN_EXPORT const kiln_plugin_descriptor* kiln_plugin_get(void) {
  return &kDescriptor;
}
