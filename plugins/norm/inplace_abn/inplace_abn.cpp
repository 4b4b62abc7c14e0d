// kiln_inplace_abn — mapillary's InPlace-ABN as two norm components, "inplace_abn" and
// "inplace_abn_sync" (training statistics shared across ranks through plugins/norm/common, as
// syncbn). Batch norm fused with an invertible activation, written over its input: the layer
// keeps only its output, and backward recovers what it needs from it:
//   forward   y = act(xhat * w_eff + b),   xhat = (x - mean) * invstd
//   backward  z = act^-1(y), dz = dy * act'(z), xhat = (z - b) / w_eff
// with w_eff = |weight| + eps (mapillary's reparametrisation): never zero, so the affine map is
// invertible whatever the learned weight; grad_weight carries sign(weight) through the |.|.
// Statistics are float32 for half inputs; elementwise passes run over chunks of samples so the
// float32 temporaries stay small (the point of the layer is memory).
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>

#include <memory>
#include <tuple>

#include "activation.hpp"
#include "bn_stats.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"
#include "options.hpp"
#include "report.hpp"
#include "stats.hpp"

namespace {

using kiln::norm::channel_f32;
using kiln::norm::per_channel;

struct Abn {
  const kiln_host_api* host;
  const char* name;
  int64_t features;
  kiln::norm::BnOptions options;
  kiln::abn::Activation act;
  bool sync;
};

// w_eff = |weight| + eps, or 1 without affine parameters (as mapillary).
at::Tensor effective_weight(const Abn& abn, const DLTensor* weight, const at::Tensor& like) {
  if (weight == nullptr) return channel_f32(nullptr, abn.features, 1.0, like);
  return channel_f32(weight, abn.features, 1.0, like).abs() + abn.options.eps;
}

kiln_status* create(const kiln_host_api* host, const kiln_options* options,
                    const kiln_norm_setup* setup, kiln_norm_layout* layout, void** out, bool sync) {
  return KILN_GUARD(host, {
    auto abn = std::make_unique<Abn>();
    abn->host = host;
    abn->name = sync ? "inplace_abn_sync" : "inplace_abn";
    abn->features = setup->num_features;
    abn->options = kiln::norm::read_bn_options(options, abn->name, *setup);
    abn->act = kiln::abn::invertible_activation(setup, abn->name);
    abn->sync = sync;
    kiln::norm::fill_layout(layout, abn->options.affine, abn->options.track_running_stats,
                            KILN_NORM_SAVE_OUTPUT, /*fused_activation=*/true,
                            /*in_place=*/true, /*frozen=*/false);
    *out = abn.release();
  });
}

kiln_status* abn_create(const kiln_host_api* host, const kiln_options* options,
                        const kiln_norm_setup* setup, kiln_norm_layout* layout, void** out) {
  return create(host, options, setup, layout, out, /*sync=*/false);
}

kiln_status* abn_sync_create(const kiln_host_api* host, const kiln_options* options,
                             const kiln_norm_setup* setup, kiln_norm_layout* layout, void** out) {
  return create(host, options, setup, layout, out, /*sync=*/true);
}

void abn_destroy(void* instance) { delete static_cast<Abn*>(instance); }

// ---- float32: ATen's fused batch-norm kernels -------------------------------------------------
// The generic passes below build float32 temporaries chunk by chunk, which costs several passes
// over the data per layer. For float32 inputs, one fused kernel normalises (native_batch_norm)
// and one reduces the backward (native_batch_norm_backward, fed the recovered xhat with mean 0
// and invstd 1, so its formula is exactly InPlace-ABN's); the activation and its inverse are
// single elementwise kernels.

// act(src) written into dst (which may be the layer's input).
void activate_into(const kiln::abn::Activation& act, const at::Tensor& src, at::Tensor& dst) {
  if (act.kind == KILN_ACT_LEAKY_RELU) {
    at::leaky_relu_out(dst, src, act.param);
  } else if (act.kind == KILN_ACT_ELU) {
    at::elu_out(dst, src, act.param);
  } else {
    dst.copy_(src);
  }
}

void fused_forward(const Abn& abn, kiln_call_context* ctx, const kiln_norm_forward_args* args,
                   const at::Tensor& x) {
  at::Tensor w_eff = effective_weight(abn, args->weight, x).to(at::kFloat);
  at::Tensor bias = channel_f32(args->bias, abn.features, 0.0, x);
  at::Tensor out = kiln::as_tensor(*args->output);
  const bool batch_stats = kiln::norm::uses_batch_stats(abn.options, args->training,
                                                        args->running_mean, args->running_var);
  if (batch_stats && !abn.sync) {
    // Statistics, running-statistics update (unbiased variance) and normalisation in one kernel.
    at::Tensor rm, rv;
    if (abn.options.track_running_stats) {
      rm = kiln::norm::optional_view(args->running_mean);
      rv = kiln::norm::optional_view(args->running_var);
    }
    double momentum = abn.options.momentum;
    kiln_norm_batch_stats* report =
        args->training != 0 ? kiln::norm::report_request(args, abn.name) : nullptr;
    if (report != nullptr) {
      // The host updates the running statistics itself: the kernel writes the batch's into the
      // report instead (report.hpp).
      const kiln::norm::ReportAsRunning r = kiln::norm::running_stats_for_report(report);
      rm = r.mean;
      rv = r.var;
      momentum = 1.0;
    }
    auto [y, mean, invstd] =
        at::native_batch_norm(x, w_eff, bias, rm, rv, /*training=*/true, momentum, abn.options.eps);
    activate_into(abn.act, y, out);
    kiln::norm::save_stats(args, {mean.to(at::kDouble), invstd.to(at::kDouble)});
    if (report != nullptr) {
      kiln::norm::finish_report(report, kiln::norm::values_per_channel(x), abn.options.momentum);
    }
    return;
  }
  // Shared (or running) statistics, applied as fixed ones: var = invstd^-2 - eps reproduces
  // the invstd exactly in the kernel's rsqrt(var + eps).
  const kiln::norm::Applied applied =
      kiln::norm::forward_stats(abn.host, ctx, abn.options, args, x, abn.sync, abn.name);
  at::Tensor mean = applied.mean.to(at::kFloat);
  at::Tensor var = (applied.invstd.pow(-2) - abn.options.eps).to(at::kFloat);
  auto [y, unused_mean, unused_invstd] =
      at::native_batch_norm(x, w_eff, bias, mean, var, /*training=*/false, 0.0, abn.options.eps);
  activate_into(abn.act, y, out);
  kiln::norm::save_stats(args, applied);
}

void fused_backward(const Abn& abn, kiln_call_context* ctx, const kiln_norm_backward_args* args,
                    const at::Tensor& y, const at::Tensor& dy) {
  const int64_t channels = abn.features, dim = y.dim();
  // z = act^-1(y) and dz = dy * act'(z), both from y.
  at::Tensor xhat, dz;
  if (abn.act.kind == KILN_ACT_LEAKY_RELU) {
    xhat = at::leaky_relu(y, 1.0 / abn.act.param);
    dz = at::leaky_relu_backward(dy, y, abn.act.param, /*self_is_result=*/true);
  } else {
    std::tie(xhat, dz) = kiln::abn::invert(abn.act, y, dy);
    if (xhat.is_same(y)) xhat = y.clone();
  }
  at::Tensor invstd = kiln::as_tensor(*args->save_invstd).to(at::kFloat);
  at::Tensor w_eff = effective_weight(abn, args->weight, y).to(at::kFloat);
  at::Tensor bias = channel_f32(args->bias, channels, 0.0, y);
  xhat.sub_(per_channel(bias, dim)).div_(per_channel(w_eff, dim));  // xhat = (z - b) / w_eff

  const bool batch_stats = kiln::norm::uses_batch_stats(abn.options, args->training,
                                                        args->running_mean, args->running_var);
  const bool local = batch_stats && !abn.sync;
  at::Tensor zeros = at::zeros({channels}, invstd.options());
  at::Tensor ones = at::ones({channels}, invstd.options());
  // With mean 0 and invstd 1 over xhat, the kernel's sums are sum(dz * xhat) and sum(dz), and
  // (batch statistics) its input gradient is gain * (dz - mean(dz) - xhat * mean(dz * xhat)).
  auto [gi, sum_dz_xhat, sum_dz] = at::native_batch_norm_backward(
      dz, xhat, w_eff * invstd, at::Tensor(), at::Tensor(), zeros, ones, /*train=*/true,
      abn.options.eps, {local && args->grad_input != nullptr, true, true});
  if (args->grad_bias != nullptr) kiln::as_tensor(*args->grad_bias).copy_(sum_dz);
  if (args->grad_weight != nullptr) {
    at::Tensor w = kiln::as_tensor(*args->weight).to(at::kFloat);
    kiln::as_tensor(*args->grad_weight).copy_(sum_dz_xhat * w.sign());  // d|w|/dw = sign(w)
  }
  at::Tensor gain = per_channel(w_eff * invstd, dim);
  if (local) {
    if (args->grad_input != nullptr) kiln::as_tensor(*args->grad_input).copy_(gi);
    return;
  }
  if (!batch_stats) {
    if (args->grad_input != nullptr) kiln::as_tensor(*args->grad_input).copy_(dz.mul_(gain));
    return;
  }
  // Synchronised: the two sums over the group, then the input gradient with the global means.
  // Every rank takes part in the reduction even when it wants no grad_input.
  const int64_t count_per_channel = y.numel() / channels;  // exact
  const double local_count = static_cast<double>(count_per_channel);
  const kiln::norm::GradSums total =
      kiln::norm::backward_sums(abn.host, ctx, abn.options, args->training, abn.sync, local_count,
                                sum_dz, sum_dz_xhat, abn.name);
  if (args->grad_input == nullptr) return;
  at::Tensor mean_dz = per_channel((total.a / total.count).to(at::kFloat), dim);
  at::Tensor mean_dz_xhat = per_channel((total.b / total.count).to(at::kFloat), dim);
  dz.sub_(mean_dz).sub_(xhat.mul_(mean_dz_xhat)).mul_(gain);
  kiln::as_tensor(*args->grad_input).copy_(dz);
}

kiln_status* abn_forward(void* instance, kiln_call_context* ctx,
                         const kiln_norm_forward_args* args) {
  const Abn& abn = *static_cast<const Abn*>(instance);
  return KILN_GUARD(abn.host, {
    at::Tensor x = kiln::as_tensor(*args->input);
    kiln::norm::check_input(x, abn.features, abn.name);
    if (x.scalar_type() == at::kFloat) return fused_forward(abn, ctx, args, x);
    // Statistics first: the output may be the input's memory.
    const kiln::norm::Applied applied =
        kiln::norm::forward_stats(abn.host, ctx, abn.options, args, x, abn.sync, abn.name);
    at::Tensor scale = applied.invstd * effective_weight(abn, args->weight, x);
    at::Tensor shift = channel_f32(args->bias, abn.features, 0.0, x) - applied.mean * scale;
    at::Tensor scale_b = per_channel(scale.to(at::kFloat), x.dim());
    at::Tensor shift_b = per_channel(shift.to(at::kFloat), x.dim());
    at::Tensor y = kiln::as_tensor(*args->output);
    // Each chunk is read completely before it is overwritten, so y may alias x.
    kiln::norm::for_each_chunk(x, [&](int64_t first, int64_t count) {
      at::Tensor z = x.narrow(0, first, count).to(at::kFloat) * scale_b + shift_b;
      kiln::abn::apply_(abn.act, z);
      y.narrow(0, first, count).copy_(z);
    });
    kiln::norm::save_stats(args, applied);
  });
}

kiln_status* abn_backward(void* instance, kiln_call_context* ctx,
                          const kiln_norm_backward_args* args) {
  const Abn& abn = *static_cast<const Abn*>(instance);
  return KILN_GUARD(abn.host, {
    at::Tensor y = kiln::as_tensor(*args->saved);
    at::Tensor dy = kiln::as_tensor(*args->grad_output);
    kiln::norm::check_input(y, abn.features, abn.name);
    if (y.scalar_type() == at::kFloat && dy.scalar_type() == at::kFloat) {
      return fused_backward(abn, ctx, args, y, dy);
    }
    const int64_t channels = abn.features, dim = y.dim();
    const std::vector<int64_t> dims = kiln::norm::reduce_dims(y);
    at::Tensor invstd = kiln::as_tensor(*args->save_invstd).to(at::kFloat);
    at::Tensor w_eff = effective_weight(abn, args->weight, y);
    at::Tensor w_eff_b = per_channel(w_eff, dim);
    at::Tensor b_b = per_channel(channel_f32(args->bias, channels, 0.0, y), dim);
    // {xhat, dz} of one chunk, recovered from the saved output.
    auto recover = [&](int64_t first, int64_t count) {
      auto [z, dz] = kiln::abn::invert(abn.act, y.narrow(0, first, count).to(at::kFloat),
                                       dy.narrow(0, first, count).to(at::kFloat));
      return std::make_pair((z - b_b) / w_eff_b, dz);
    };

    at::Tensor sum_dz = at::zeros({channels}, invstd.options());
    at::Tensor sum_dz_xhat = at::zeros({channels}, invstd.options());
    kiln::norm::for_each_chunk(y, [&](int64_t first, int64_t count) {
      auto [xhat, dz] = recover(first, count);
      sum_dz += dz.sum(dims);
      sum_dz_xhat += (dz * xhat).sum(dims);
    });
    // This rank's parameter gradients (DDP averages them); d|w|/dw = sign(w).
    if (args->grad_bias != nullptr) kiln::as_tensor(*args->grad_bias).copy_(sum_dz);
    if (args->grad_weight != nullptr) {
      at::Tensor w = kiln::as_tensor(*args->weight).to(at::kFloat);
      kiln::as_tensor(*args->grad_weight).copy_(sum_dz_xhat * w.sign());
    }

    at::Tensor gain = per_channel(w_eff * invstd, dim);
    const bool batch_stats = kiln::norm::uses_batch_stats(abn.options, args->training,
                                                          args->running_mean, args->running_var);
    at::Tensor mean_dz, mean_dz_xhat;
    if (batch_stats) {
      // Every rank takes part in the reduction even when it wants no grad_input.
      const int64_t count_per_channel = y.numel() / channels;  // exact
      const double local_count = static_cast<double>(count_per_channel);
      const kiln::norm::GradSums total =
          kiln::norm::backward_sums(abn.host, ctx, abn.options, args->training, abn.sync,
                                    local_count, sum_dz, sum_dz_xhat, abn.name);
      mean_dz = per_channel(total.a / total.count, dim);
      mean_dz_xhat = per_channel(total.b / total.count, dim);
    }
    if (args->grad_input == nullptr) return;
    at::Tensor dx = kiln::as_tensor(*args->grad_input);
    // Chunk by chunk: dx may alias dy or y.
    kiln::norm::for_each_chunk(y, [&](int64_t first, int64_t count) {
      auto [xhat, dz] = recover(first, count);
      at::Tensor g = batch_stats ? (dz - mean_dz - xhat * mean_dz_xhat) * gain : dz * gain;
      dx.narrow(0, first, count).copy_(g);
    });
  });
}

const kiln_norm_vtable kVtable = {sizeof(kiln_norm_vtable), abn_create, abn_destroy, abn_forward,
                                  abn_backward};
const kiln_norm_vtable kSyncVtable = {sizeof(kiln_norm_vtable), abn_sync_create, abn_destroy,
                                      abn_forward, abn_backward};

const kiln_option_spec kOptions[] = {KILN_NORM_MOMENTUM_SPEC, KILN_NORM_EPS_SPEC,
                                     KILN_NORM_AFFINE_SPEC, KILN_NORM_TRACK_SPEC};
const kiln_option_spec kSyncOptions[] = {KILN_NORM_MOMENTUM_SPEC, KILN_NORM_EPS_SPEC,
                                         KILN_NORM_AFFINE_SPEC, KILN_NORM_TRACK_SPEC,
                                         KILN_NORM_GROUP_SIZE_SPEC};

const kiln_attribute kAttributes[] = {{"activations", "leaky_relu,elu,identity"}};

const kiln_capabilities kCaps = {sizeof(kiln_capabilities),
                                 KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32 |
                                     KILN_CAP_DTYPE_F16 | KILN_CAP_DTYPE_BF16,
                                 1, kAttributes};

const kiln_component_descriptor kAbn = {
    sizeof(kiln_component_descriptor),
    KILN_COMPONENT_NORM,
    0,
    "inplace_abn",
    {1, 0, 0},
    "in-place batch norm + invertible activation (mapillary InPlace-ABN)",
    &kCaps,
    sizeof(kOptions) / sizeof(kOptions[0]),
    kOptions,
    &kVtable};

const kiln_component_descriptor kAbnSync = {sizeof(kiln_component_descriptor),
                                            KILN_COMPONENT_NORM,
                                            0,
                                            "inplace_abn_sync",
                                            {1, 0, 0},
                                            "InPlace-ABN with batch statistics shared across ranks",
                                            &kCaps,
                                            sizeof(kSyncOptions) / sizeof(kSyncOptions[0]),
                                            kSyncOptions,
                                            &kSyncVtable};

const kiln_component_descriptor* const kComponents[] = {&kAbn, &kAbnSync};

const kiln_plugin_descriptor kDescriptor = KILN_PLUGIN_DESCRIPTOR_INIT(
    "kiln-inplace-abn", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
