// kiln_frozen_bn — the "frozen_bn" norm component: torchvision's / detectron2's
// FrozenBatchNorm2d. y = x * scale + shift with scale = weight * rsqrt(running_var + eps) and
// shift = bias - running_mean * scale, identical in training and evaluation; the statistics and
// the affine parameters never change (the host keeps weight and bias as buffers). Backward needs
// no saved tensor: grad_input = grad_output * scale.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace {

using kiln::norm::channel_f32;
using kiln::norm::per_channel;

constexpr const char* kName = "frozen_bn";

struct FrozenBn {
  const kiln_host_api* host;
  int64_t features;
  double eps;
};

// The fixed per-channel scale (float32 [C]); absent tensors take their initial values
// (weight 1, running_var 1), as the host initialises them.
at::Tensor scale_of(const FrozenBn& bn, const DLTensor* weight, const DLTensor* running_var,
                    const at::Tensor& like) {
  return channel_f32(weight, bn.features, 1.0, like) *
         (channel_f32(running_var, bn.features, 1.0, like) + bn.eps).rsqrt();
}

kiln_status* fbn_create(const kiln_host_api* host, const kiln_options* options,
                        const kiln_norm_setup* setup, kiln_norm_layout* layout, void** out) {
  return KILN_GUARD(host, {
    auto bn = std::make_unique<FrozenBn>();
    bn->host = host;
    bn->features = setup->num_features;
    bn->eps = kiln_options_float(options, "eps", 1e-5);
    if (bn->features <= 0) {
      throw kiln::Error(KILN_ERR_INVALID_ARGUMENT, std::string(kName) +
                                                       ": num_features must be positive, got " +
                                                       std::to_string(bn->features));
    }
    kiln::norm::check_eps(bn->eps, kName);
    // Without layout.frozen (ABI < 1.2) the host would train weight and bias and would not know
    // KILN_NORM_SAVE_NOTHING: refuse rather than silently become a trainable layer.
    if (!KILN_HAS_FIELD(layout, kiln_norm_layout, frozen)) {
      throw kiln::Error(KILN_ERR_UNSUPPORTED,
                        std::string(kName) +
                            ": the host does not know frozen layers (kiln_norm_layout.frozen, "
                            "ABI 1.2); update the host");
    }
    kiln::norm::fill_layout(layout, /*affine=*/true, /*running_stats=*/true, KILN_NORM_SAVE_NOTHING,
                            /*fused_activation=*/false,
                            /*in_place=*/false, /*frozen=*/true);
    *out = bn.release();
  });
}

void fbn_destroy(void* instance) { delete static_cast<FrozenBn*>(instance); }

kiln_status* fbn_forward(void* instance, kiln_call_context*, const kiln_norm_forward_args* args) {
  const FrozenBn& bn = *static_cast<const FrozenBn*>(instance);
  return KILN_GUARD(bn.host, {
    at::Tensor x = kiln::as_tensor(*args->input);
    kiln::norm::check_input(x, bn.features, kName);
    at::Tensor mean = channel_f32(args->running_mean, bn.features, 0.0, x);
    at::Tensor invstd = (channel_f32(args->running_var, bn.features, 1.0, x) + bn.eps).rsqrt();
    at::Tensor s = scale_of(bn, args->weight, args->running_var, x);
    at::Tensor shift = channel_f32(args->bias, bn.features, 0.0, x) - mean * s;
    at::Tensor scale_b = per_channel(s, x.dim()), shift_b = per_channel(shift, x.dim());
    at::Tensor y = kiln::as_tensor(*args->output);
    kiln::norm::for_each_chunk(x, [&](int64_t first, int64_t count) {
      y.narrow(0, first, count).copy_(x.narrow(0, first, count).to(at::kFloat) * scale_b + shift_b);
    });
    // The statistics applied (the running ones, in training too).
    if (args->save_mean != nullptr) kiln::as_tensor(*args->save_mean).copy_(mean);
    if (args->save_invstd != nullptr) kiln::as_tensor(*args->save_invstd).copy_(invstd);
  });
}

kiln_status* fbn_backward(void* instance, kiln_call_context*, const kiln_norm_backward_args* args) {
  const FrozenBn& bn = *static_cast<const FrozenBn*>(instance);
  return KILN_GUARD(bn.host, {
    at::Tensor dy = kiln::as_tensor(*args->grad_output);
    kiln::norm::check_input(dy, bn.features, kName);
    // Fixed parameters: a host that still asks for their gradients gets zeros.
    if (args->grad_weight != nullptr) kiln::as_tensor(*args->grad_weight).zero_();
    if (args->grad_bias != nullptr) kiln::as_tensor(*args->grad_bias).zero_();
    if (args->grad_input == nullptr) return;
    at::Tensor scale_b = per_channel(scale_of(bn, args->weight, args->running_var, dy), dy.dim());
    at::Tensor dx = kiln::as_tensor(*args->grad_input);
    kiln::norm::for_each_chunk(dy, [&](int64_t first, int64_t count) {
      dx.narrow(0, first, count).copy_(dy.narrow(0, first, count).to(at::kFloat) * scale_b);
    });
  });
}

const kiln_norm_vtable kVtable = {sizeof(kiln_norm_vtable), fbn_create, fbn_destroy, fbn_forward,
                                  fbn_backward};

const kiln_option_spec kOptions[] = {KILN_NORM_EPS_SPEC};

const kiln_capabilities kCaps = {sizeof(kiln_capabilities),
                                 KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32 |
                                     KILN_CAP_DTYPE_F16 | KILN_CAP_DTYPE_BF16,
                                 0, nullptr};

const kiln_component_descriptor kFrozenBn = {
    sizeof(kiln_component_descriptor),
    KILN_COMPONENT_NORM,
    0,
    kName,
    {1, 0, 0},
    "batch norm with fixed statistics and affine parameters, as torchvision FrozenBatchNorm2d",
    &kCaps,
    sizeof(kOptions) / sizeof(kOptions[0]),
    kOptions,
    &kVtable};

const kiln_component_descriptor* const kComponents[] = {&kFrozenBn};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-frozen-bn", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
