// kiln_syncbn — the "syncbn" norm component: torch.nn.SyncBatchNorm. Training statistics are
// shared across the ranks of the call's process group (or consecutive groups of group_size
// ranks): each rank packs [n, mean, M2] per channel, ONE allgather exchanges them, and Chan's
// formula combines them, so uneven and one-sample-per-rank batches are exact. Backward reduces
// sum(dy) and sum(dy * (x - mean)) once. Generic ATen ops (PyTorch's own SyncBN kernels are
// CUDA-only), statistics in float32 for every input dtype.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>

#include <memory>

#include "bn_stats.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace {

using kiln::norm::per_channel;

constexpr const char* kName = "syncbn";

struct SyncBn {
  const kiln_host_api* host;
  int64_t features;
  kiln::norm::BnOptions options;
};

kiln_status* sbn_create(const kiln_host_api* host, const kiln_options* options,
                        const kiln_norm_setup* setup, kiln_norm_layout* layout, void** out) {
  return KILN_GUARD(host, {
    auto bn = std::make_unique<SyncBn>();
    bn->host = host;
    bn->features = setup->num_features;
    bn->options = kiln::norm::read_bn_options(options, kName, *setup);
    kiln::norm::fill_layout(layout, bn->options.affine, bn->options.track_running_stats,
                            KILN_NORM_SAVE_INPUT, /*fused_activation=*/false,
                            /*in_place=*/false, /*frozen=*/false);
    *out = bn.release();
  });
}

void sbn_destroy(void* instance) { delete static_cast<SyncBn*>(instance); }

kiln_status* sbn_forward(void* instance, kiln_call_context* ctx,
                         const kiln_norm_forward_args* args) {
  const SyncBn& bn = *static_cast<const SyncBn*>(instance);
  return KILN_GUARD(bn.host, {
    at::Tensor x = kiln::as_tensor(*args->input);
    kiln::norm::check_input(x, bn.features, kName);
    const kiln::norm::Applied applied =
        kiln::norm::forward_stats(bn.host, ctx, bn.options, args, x, /*sync=*/true, kName);
    at::Tensor w = kiln::norm::channel_f32(args->weight, bn.features, 1.0, x);
    at::Tensor b = kiln::norm::channel_f32(args->bias, bn.features, 0.0, x);
    // y = (x - mean) * invstd * w + b as one per-channel scale and shift.
    at::Tensor scale = per_channel((applied.invstd * w).to(at::kFloat), x.dim());
    at::Tensor shift = per_channel((b - applied.mean * applied.invstd * w).to(at::kFloat), x.dim());
    at::Tensor y = kiln::as_tensor(*args->output);
    kiln::norm::for_each_chunk(x, [&](int64_t first, int64_t count) {
      y.narrow(0, first, count).copy_(x.narrow(0, first, count).to(at::kFloat) * scale + shift);
    });
    kiln::norm::save_stats(args, applied);
  });
}

kiln_status* sbn_backward(void* instance, kiln_call_context* ctx,
                          const kiln_norm_backward_args* args) {
  const SyncBn& bn = *static_cast<const SyncBn*>(instance);
  return KILN_GUARD(bn.host, {
    at::Tensor x = kiln::as_tensor(*args->saved);
    at::Tensor dy = kiln::as_tensor(*args->grad_output);
    kiln::norm::check_input(x, bn.features, kName);
    const int64_t channels = bn.features, dim = x.dim();
    const std::vector<int64_t> dims = kiln::norm::reduce_dims(x);
    at::Tensor mean = kiln::as_tensor(*args->save_mean).to(at::kFloat);
    at::Tensor invstd = kiln::as_tensor(*args->save_invstd).to(at::kFloat);
    at::Tensor w = kiln::norm::channel_f32(args->weight, channels, 1.0, x);
    at::Tensor mean_b = per_channel(mean, dim);

    // Local sums: sum(dy) and sum(dy * (x - mean)) per channel.
    at::Tensor sum_dy = at::zeros({channels}, mean.options());
    at::Tensor sum_dy_xmu = at::zeros({channels}, mean.options());
    kiln::norm::for_each_chunk(x, [&](int64_t first, int64_t count) {
      at::Tensor g = dy.narrow(0, first, count).to(at::kFloat);
      sum_dy += g.sum(dims);
      sum_dy_xmu += (g * (x.narrow(0, first, count).to(at::kFloat) - mean_b)).sum(dims);
    });
    // The parameters' gradients are this rank's (DDP averages them, as for SyncBatchNorm).
    if (args->grad_bias != nullptr) kiln::as_tensor(*args->grad_bias).copy_(sum_dy);
    if (args->grad_weight != nullptr) {
      kiln::as_tensor(*args->grad_weight).copy_(sum_dy_xmu * invstd);
    }

    const bool batch_stats = kiln::norm::uses_batch_stats(bn.options, args->training,
                                                          args->running_mean, args->running_var);
    at::Tensor gain = per_channel(invstd * w, dim);
    if (!batch_stats) {
      // Fixed (running) statistics: the normalisation is affine in x.
      if (args->grad_input != nullptr) {
        at::Tensor dx = kiln::as_tensor(*args->grad_input);
        kiln::norm::for_each_chunk(x, [&](int64_t first, int64_t count) {
          dx.narrow(0, first, count).copy_(dy.narrow(0, first, count).to(at::kFloat) * gain);
        });
      }
      return;
    }
    // Every rank takes part in the reduction even when it wants no grad_input.
    const double local_count = channels > 0 ? static_cast<double>(x.numel() / channels) : 0.0;
    const kiln::norm::GradSums total =
        kiln::norm::backward_sums(bn.host, ctx, bn.options, args->training, /*sync=*/true,
                                  local_count, sum_dy, sum_dy_xmu, kName);
    if (args->grad_input == nullptr) return;
    at::Tensor mean_dy = per_channel(total.a / total.count, dim);
    at::Tensor proj = per_channel(total.b / total.count * invstd * invstd, dim);
    at::Tensor dx = kiln::as_tensor(*args->grad_input);
    kiln::norm::for_each_chunk(x, [&](int64_t first, int64_t count) {
      at::Tensor xmu = x.narrow(0, first, count).to(at::kFloat) - mean_b;
      at::Tensor g = dy.narrow(0, first, count).to(at::kFloat);
      dx.narrow(0, first, count).copy_((g - mean_dy - xmu * proj) * gain);
    });
  });
}

const kiln_norm_vtable kVtable = {sizeof(kiln_norm_vtable), sbn_create, sbn_destroy, sbn_forward,
                                  sbn_backward};

const kiln_option_spec kOptions[] = {KILN_NORM_MOMENTUM_SPEC, KILN_NORM_EPS_SPEC,
                                     KILN_NORM_AFFINE_SPEC, KILN_NORM_TRACK_SPEC,
                                     KILN_NORM_GROUP_SIZE_SPEC};

const kiln_capabilities kCaps = {sizeof(kiln_capabilities),
                                 KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32 |
                                     KILN_CAP_DTYPE_F16 | KILN_CAP_DTYPE_BF16,
                                 0, nullptr};

const kiln_component_descriptor kSyncBn = {
    sizeof(kiln_component_descriptor),
    KILN_COMPONENT_NORM,
    0,
    kName,
    {1, 0, 0},
    "batch normalisation with statistics shared across ranks, as torch.nn.SyncBatchNorm",
    &kCaps,
    sizeof(kOptions) / sizeof(kOptions[0]),
    kOptions,
    &kVtable};

const kiln_component_descriptor* const kComponents[] = {&kSyncBn};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-syncbn", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
