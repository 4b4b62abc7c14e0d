// kiln_syncbn — the "syncbn" norm component: torch.nn.SyncBatchNorm. Training statistics are
// shared across the ranks of the call's process group (or consecutive groups of group_size
// ranks): each rank packs [n, mean, M2] per channel, ONE allgather exchanges them, and Chan's
// formula combines them, so uneven and one-sample-per-rank batches are exact. Backward reduces
// sum(dy) and sum(dy * (x - mean)) once. Float32 CPU data goes through the fused kernels of
// plugins/norm/common (with the model's ReLU or leaky ReLU); everything else through generic
// ATen ops (PyTorch's own SyncBN kernels are CUDA-only), statistics in float32 for every dtype.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "bn_stats.hpp"
#include "fused_bn.hpp"
#include "fused_cpu.hpp"
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
  float slope = 1.0F;  // the activation the layer applies (1: none, the host applies any)
};

namespace fused = kiln::norm::fused;

// What the kernels apply, from the statistics saved for backward, which both passes derive it
// from.
fused::Affine applied_affine(const SyncBn& bn, const DLTensor* weight, const DLTensor* bias,
                             const at::Tensor& mean, const at::Tensor& invstd) {
  at::Tensor m = mean.to(at::kCPU, at::kFloat).contiguous();
  at::Tensor i = invstd.to(at::kCPU, at::kFloat).contiguous();
  return fused::affine(weight, bias,
                       std::vector<float>(m.data_ptr<float>(), m.data_ptr<float>() + bn.features),
                       std::vector<float>(i.data_ptr<float>(), i.data_ptr<float>() + bn.features));
}

kiln_status* sbn_create(const kiln_host_api* host, const kiln_options* options,
                        const kiln_norm_setup* setup, kiln_norm_layout* layout, void** out) {
  return KILN_GUARD(host, {
    auto bn = std::make_unique<SyncBn>();
    bn->host = host;
    bn->features = setup->num_features;
    bn->options = kiln::norm::read_bn_options(options, kName, *setup);
    const bool fuse = fused::fused_slope(setup, /*enabled=*/true, bn->slope);
    kiln::norm::fill_layout(layout, bn->options.affine, bn->options.track_running_stats,
                            KILN_NORM_SAVE_INPUT, /*fused_activation=*/fuse,
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
    at::Tensor y = kiln::as_tensor(*args->output);
    // y = act((x - mean) * (invstd * w) + b).
    fused::Layout l;
    if (fused::layout_of(x, {y}, l)) {
      const fused::Affine f =
          applied_affine(bn, args->weight, args->bias, applied.mean, applied.invstd);
      fused::normalise(x.data_ptr<float>(), y.data_ptr<float>(), l, f.mean.data(), f.scale.data(),
                       f.bias.data(), bn.slope);
    } else {
      // On the data's device (no read-back): CUDA, half precision, mixed layouts.
      at::Tensor w = kiln::norm::channel_f32(args->weight, bn.features, 1.0, x);
      at::Tensor m = per_channel(applied.mean.to(at::kFloat), x.dim());
      at::Tensor a = per_channel((applied.invstd * w).to(at::kFloat), x.dim());
      at::Tensor b = per_channel(kiln::norm::channel_f32(args->bias, bn.features, 0.0, x), x.dim());
      kiln::norm::for_each_chunk(x, [&](int64_t first, int64_t count) {
        y.narrow(0, first, count).copy_((x.narrow(0, first, count).to(at::kFloat) - m) * a + b);
      });
      fused::activate_(bn.slope, y);
    }
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
    at::Tensor mean = kiln::as_tensor(*args->save_mean).to(at::kFloat);
    at::Tensor invstd = kiln::as_tensor(*args->save_invstd).to(at::kFloat);
    at::Tensor w = kiln::norm::channel_f32(args->weight, channels, 1.0, x);
    fused::Layout l;
    const bool kernels = fused::backward_layout(x, dy, l);
    // Read back only for the CPU kernels.
    const fused::Affine f =
        kernels ? applied_affine(bn, args->weight, args->bias, mean, invstd) : fused::Affine{};
    at::Tensor mean_b = per_channel(mean, dim);
    // Through the activation the layer applied (ATen's path; the kernels mask as they go).
    if (!kernels) dy = fused::through_activation(bn.slope, dy, x, args);

    // Local sums: sum(dz) and sum(dz * (x - mean)) per channel, dz at the activation's input.
    at::Tensor sum_dy, sum_dy_xmu;
    if (kernels) {
      std::vector<double> s1(channels), s2(channels);
      fused::grad_sums(dy.data_ptr<float>(), x.data_ptr<float>(), l, f.scale.data(), f.bias.data(),
                       bn.slope, f.mean.data(), s1.data(), s2.data());
      sum_dy = at::tensor(s1, mean.options().dtype(at::kDouble)).to(at::kFloat);
      sum_dy_xmu = at::tensor(s2, mean.options().dtype(at::kDouble)).to(at::kFloat);
    } else {
      const std::vector<int64_t> dims = kiln::norm::reduce_dims(x);
      sum_dy = at::zeros({channels}, mean.options());
      sum_dy_xmu = at::zeros({channels}, mean.options());
      kiln::norm::for_each_chunk(x, [&](int64_t first, int64_t count) {
        at::Tensor g = dy.narrow(0, first, count).to(at::kFloat);
        sum_dy += g.sum(dims);
        sum_dy_xmu += (g * (x.narrow(0, first, count).to(at::kFloat) - mean_b)).sum(dims);
      });
    }
    // The parameters' gradients are this rank's (DDP averages them, as for SyncBatchNorm).
    if (args->grad_bias != nullptr) kiln::as_tensor(*args->grad_bias).copy_(sum_dy);
    if (args->grad_weight != nullptr) {
      kiln::as_tensor(*args->grad_weight).copy_(sum_dy_xmu * invstd);
    }

    const bool batch_stats = kiln::norm::uses_batch_stats(bn.options, args->training,
                                                          args->running_mean, args->running_var);
    at::Tensor gain = invstd * w;
    at::Tensor proj = at::zeros_like(gain), mean_dy = at::zeros_like(gain);
    if (batch_stats) {
      // Every rank takes part in the reduction even when it wants no grad_input.
      const int64_t count_per_channel = channels > 0 ? x.numel() / channels : 0;  // exact
      const double local_count = static_cast<double>(count_per_channel);
      const kiln::norm::GradSums total =
          kiln::norm::backward_sums(bn.host, ctx, bn.options, args->training, /*sync=*/true,
                                    local_count, sum_dy, sum_dy_xmu, kName);
      mean_dy = (total.a / total.count).to(at::kFloat);
      proj = (total.b / total.count * invstd * invstd).to(at::kFloat);
    }
    if (args->grad_input == nullptr) return;
    at::Tensor dx = kiln::as_tensor(*args->grad_input);
    // dx = (dz - mean_dz - (x - mean) * proj) * gain (fixed statistics: proj = mean_dz = 0).
    if (kernels && fused::layout_of(x, {dx}, l)) {
      at::Tensor a = gain.contiguous(), b = (-proj * gain).contiguous();
      at::Tensor c = (-mean_dy * gain).contiguous();
      fused::grad_input(dy.data_ptr<float>(), x.data_ptr<float>(), dx.data_ptr<float>(), l,
                        f.scale.data(), f.bias.data(), bn.slope, f.mean.data(), a.data_ptr<float>(),
                        b.data_ptr<float>(), c.data_ptr<float>());
      return;
    }
    if (kernels) dy = fused::through_activation(bn.slope, dy, x, args);
    at::Tensor gain_b = per_channel(gain, dim), proj_b = per_channel(proj, dim);
    at::Tensor mean_dy_b = per_channel(mean_dy, dim);
    kiln::norm::for_each_chunk(x, [&](int64_t first, int64_t count) {
      at::Tensor xmu = x.narrow(0, first, count).to(at::kFloat) - mean_b;
      at::Tensor g = dy.narrow(0, first, count).to(at::kFloat);
      dx.narrow(0, first, count).copy_((g - mean_dy_b - xmu * proj_b) * gain_b);
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
