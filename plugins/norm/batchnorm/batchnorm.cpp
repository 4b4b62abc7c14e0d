// kiln_batchnorm — the "batchnorm" norm component: torch.nn.BatchNorm{1,2,3}d's forward and
// backward on the host's tensors. Float32 CPU data goes through the fused kernels of
// plugins/norm/common (statistics, normalisation and the model's activation in two passes,
// backward in two); a training layer on CUDA through cuDNN where ATen's batch_norm would take it
// (cudnn_route.hpp), with its ReLU in the same kernels on half channels-last data
// (cudnn_relu.hpp); everything else through ATen's native batch-norm kernels.
#include <ATen/AccumulateType.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/native_batch_norm.h>
#include <ATen/ops/native_batch_norm_backward.h>

#include <memory>
#include <string>
#include <tuple>

#include "cudnn_relu.hpp"
#include "cudnn_route.hpp"
#include "fused_bn.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"
#include "report.hpp"

namespace {

struct BatchNorm {
  const kiln_host_api* host;
  int64_t features;
  double momentum;
  double eps;
  bool affine;
  bool track_running_stats;
  bool hands_over = false;  // backward hands its own gradients to the host (ABI 1.3)
  bool kernels = true;      // the fused CPU kernels where the data allows (option "fused")
  bool fused_act = false;   // the layer applies the activation (kiln_norm_layout.fused_activation)
  bool cuda_relu = false;   // ... a ReLU on CUDA, with cuDNN's fused kernels where they take it
  bool cuda_relu_failed = false;  // cuDNN refused the fused forward once: the other routes since
  kiln::norm::fused::BnSettings settings;  // for the kernels; slope 1 unless fused_act
};

// An at::Tensor view of an optional argument (undefined when absent).
at::Tensor optional_view(const DLTensor* t) {
  return t != nullptr ? kiln::as_tensor(*t) : at::Tensor();
}

void check_input(const BatchNorm& bn, const at::Tensor& x) {
  if (x.dim() < 2 || x.size(1) != bn.features) {
    throw kiln::Error(KILN_ERR_INVALID_ARGUMENT,
                      "batchnorm: expected input N x " + std::to_string(bn.features) +
                          " x ..., got " + std::to_string(x.dim()) + "-d input with " +
                          (x.dim() >= 2 ? std::to_string(x.size(1)) : std::string("no")) +
                          " channels");
  }
}

// Like torch.nn.BatchNorm: without running statistics, batch statistics are used in eval too.
bool uses_batch_stats(const BatchNorm& bn, int32_t training, const DLTensor* running_mean,
                      const DLTensor* running_var) {
  return training != 0 || !bn.track_running_stats || running_mean == nullptr ||
         running_var == nullptr;
}

kiln_status* bn_create(const kiln_host_api* host, const kiln_options* options,
                       const kiln_norm_setup* setup, kiln_norm_layout* layout, void** out) {
  return KILN_GUARD(host, {
    auto bn = std::make_unique<BatchNorm>();
    bn->host = host;
    bn->features = setup->num_features;
    bn->momentum = kiln_options_float(options, "momentum", 0.1);
    bn->eps = kiln_options_float(options, "eps", 1e-5);
    bn->affine = kiln_options_bool(options, "affine", 1) != 0;
    bn->track_running_stats = kiln_options_bool(options, "track_running_stats", 1) != 0;
    bn->kernels = kiln_options_bool(options, "fused", 1) != 0;
    if (bn->features <= 0) {
      throw kiln::Error(
          KILN_ERR_INVALID_ARGUMENT,
          "batchnorm: num_features must be positive, got " + std::to_string(bn->features));
    }
    if (!(bn->momentum >= 0.0 && bn->momentum <= 1.0)) {
      throw kiln::Error(KILN_ERR_INVALID_ARGUMENT, "batchnorm: momentum must be in [0, 1], got " +
                                                       std::to_string(bn->momentum));
    }
    if (!(bn->eps > 0.0)) {
      throw kiln::Error(KILN_ERR_INVALID_ARGUMENT,
                        "batchnorm: eps must be > 0, got " + std::to_string(bn->eps));
    }
    // The host's layout may be older than ours: fill only the fields it has room for.
    if (KILN_HAS_FIELD(layout, kiln_norm_layout, affine)) layout->affine = bn->affine;
    if (KILN_HAS_FIELD(layout, kiln_norm_layout, running_stats)) {
      layout->running_stats = bn->track_running_stats;
    }
    if (KILN_HAS_FIELD(layout, kiln_norm_layout, saves)) layout->saves = KILN_NORM_SAVE_INPUT;
    float slope = 1.0F;
    bn->fused_act = KILN_HAS_FIELD(layout, kiln_norm_layout, fused_activation) &&
                    kiln::norm::fused::fused_slope(setup, bn->kernels, slope);
    // cuDNN's fused kernels take affine layers only (they read the bias to redo the ReLU's mask).
    if (!bn->fused_act && bn->affine &&
        KILN_HAS_FIELD(layout, kiln_norm_layout, fused_activation) &&
        kiln::norm::cudnn::fuses_relu(host, setup, bn->kernels)) {
      // cuDNN's fused backward reads the input and the ReLU's output (ABI 1.12).
      bn->fused_act = bn->cuda_relu = true;
      slope = 0.0F;
      layout->saves = KILN_NORM_SAVE_INPUT_AND_OUTPUT;
    }
    bn->settings = {bn->eps, bn->momentum, bn->track_running_stats, slope, "batchnorm"};
    if (KILN_HAS_FIELD(layout, kiln_norm_layout, fused_activation)) {
      layout->fused_activation = bn->fused_act ? 1 : 0;
    }
    if (KILN_HAS_FIELD(layout, kiln_norm_layout, hands_over_gradients)) {
      // ATen's backward allocates its results: handing them over spares a copy of each.
      layout->hands_over_gradients = 1;
      bn->hands_over = true;
    }
    *out = bn.release();
  });
}

// Whether native_batch_norm_out can write the host's tensors as they are (see bn_forward).
bool out_kernel_fits(const at::Tensor& x, const at::Tensor& output, const at::Tensor& weight,
                     const at::Tensor& save_mean, const at::Tensor& save_invstd) {
  if (x.is_cuda()) {
    const at::ScalarType acc = at::toAccumulateType(x.scalar_type(), /*is_cuda=*/true);
    return save_mean.scalar_type() == acc && save_invstd.scalar_type() == acc &&
           (!weight.defined() || weight.scalar_type() == x.scalar_type() ||
            weight.scalar_type() == acc);
  }
  return output.is_contiguous() && (!weight.defined() || weight.scalar_type() == x.scalar_type()) &&
         save_mean.scalar_type() == x.scalar_type() && save_invstd.scalar_type() == x.scalar_type();
}

void bn_destroy(void* instance) { delete static_cast<BatchNorm*>(instance); }

// cuDNN's batch norm + ReLU. Where cuDNN fails the call, the layer says so once and keeps to the
// other routes (which write everything this one would have): slower, never a failed run.
bool fused_relu_forward(BatchNorm& bn, const kiln_norm_forward_args* args, const at::Tensor& x,
                        const at::Tensor& output, const at::Tensor& weight, const at::Tensor& bias,
                        const at::Tensor& running_mean, const at::Tensor& running_var,
                        double momentum) {
  try {
    return kiln::norm::cudnn::relu_forward(args, x, output, weight, bias, running_mean, running_var,
                                           momentum, bn.eps);
  } catch (const kiln::Error& e) {
    bn.cuda_relu_failed = true;
    if (bn.host->log != nullptr) {
      const std::string message =
          std::string(e.what()) + "; this layer applies its ReLU after cuDNN's batch norm instead";
      bn.host->log(KILN_LOG_WARN, "batchnorm", message.c_str());
    }
    return false;
  }
}

kiln_status* bn_forward(void* instance, kiln_call_context* ctx,
                        const kiln_norm_forward_args* args) {
  BatchNorm& bn = *static_cast<BatchNorm*>(instance);  // the fused route may set cuda_relu_failed
  return KILN_GUARD(bn.host, {
    at::Tensor x = kiln::as_tensor(*args->input);
    check_input(bn, x);
    if (bn.kernels && kiln::norm::fused::forward(bn.settings, args)) return;
    const bool batch_stats =
        uses_batch_stats(bn, args->training, args->running_mean, args->running_var);
    at::Tensor running_mean, running_var;
    if (bn.track_running_stats) {
      running_mean = optional_view(args->running_mean);
      running_var = optional_view(args->running_var);
    }
    double momentum = bn.momentum;
    kiln_norm_batch_stats* report =
        args->training != 0 ? kiln::norm::report_request(args, "batchnorm") : nullptr;
    if (report != nullptr) {
      // The host updates the running statistics itself: the kernel writes the batch's into the
      // report instead (report.hpp).
      const kiln::norm::ReportAsRunning r = kiln::norm::running_stats_for_report(report);
      running_mean = r.mean;
      running_var = r.var;
      momentum = 1.0;
    }
    at::Tensor output = kiln::as_tensor(*args->output);
    const at::Tensor weight = optional_view(args->weight);
    const at::Tensor bias = optional_view(args->bias);
    // After the kernel: the report when the host asked for one, and (unless the kernel applied
    // it) the model's activation.
    const auto report_done = [&] {
      if (report != nullptr) {
        kiln::norm::finish_report(report, kiln::norm::values_per_channel(x), bn.momentum);
      }
    };
    const auto finish = [&] {
      kiln::norm::fused::activate_(bn.settings.slope, output);
      report_done();
    };
    if (batch_stats && bn.cuda_relu && !bn.cuda_relu_failed &&
        fused_relu_forward(bn, args, x, output, weight, bias, running_mean, running_var,
                           momentum)) {
      report_done();
      return;
    }
    if (batch_stats && kiln::norm::cudnn::forward(args, x, output, weight, bias, running_mean,
                                                  running_var, momentum, bn.eps)) {
      finish();
      return;
    }
    // Batch statistics: ATen's out kernel writes straight into the host's output and saved
    // statistics, with no copy at the boundary. On the CPU it wants a contiguous output and
    // every tensor in the input's dtype; on CUDA it is what the functional kernel itself calls,
    // so any layout (channels_last) and AMP's mix (half data, float weight and statistics) go.
    if (batch_stats && args->save_mean != nullptr && args->save_invstd != nullptr) {
      at::Tensor save_mean = kiln::as_tensor(*args->save_mean);
      at::Tensor save_invstd = kiln::as_tensor(*args->save_invstd);
      if (out_kernel_fits(x, output, weight, save_mean, save_invstd)) {
        at::native_batch_norm_out(output, save_mean, save_invstd, x, weight, bias, running_mean,
                                  running_var, true, momentum, bn.eps);
        finish();
        return;
      }
    }
    // Updates running_mean/running_var in place (unbiased variance) when training with them.
    auto [y, mean, invstd] = at::native_batch_norm(x, weight, bias, running_mean, running_var,
                                                   batch_stats, momentum, bn.eps);
    output.copy_(y);
    finish();
    if (!batch_stats) {
      // Eval with running statistics: record the statistics that were actually applied.
      mean = running_mean;
      invstd = (running_var + bn.eps).rsqrt();
    }
    if (args->save_mean != nullptr) kiln::as_tensor(*args->save_mean).copy_(mean);
    if (args->save_invstd != nullptr) kiln::as_tensor(*args->save_invstd).copy_(invstd);
  });
}

kiln_status* bn_backward(void* instance, kiln_call_context* ctx,
                         const kiln_norm_backward_args* args) {
  const BatchNorm& bn = *static_cast<const BatchNorm*>(instance);
  return KILN_GUARD(bn.host, {
    at::Tensor x = kiln::as_tensor(*args->saved);
    check_input(bn, x);
    if (bn.kernels && kiln::norm::fused::backward(bn.settings, args, bn.hands_over)) return;
    const bool batch_stats =
        uses_batch_stats(bn, args->training, args->running_mean, args->running_var);
    at::Tensor running_mean, running_var;
    if (bn.track_running_stats) {
      running_mean = optional_view(args->running_mean);
      running_var = optional_view(args->running_var);
    }
    const std::array<bool, 3> mask = {args->grad_input != nullptr, args->grad_weight != nullptr,
                                      args->grad_bias != nullptr};
    std::tuple<at::Tensor, at::Tensor, at::Tensor> grads;
    const bool through_relu =
        bn.cuda_relu && kiln::norm::cudnn::relu_backward(
                            args, x, kiln::as_tensor(*args->grad_output), bn.eps, grads);
    const at::Tensor grad_output =
        through_relu ? at::Tensor()
                     : kiln::norm::fused::through_activation(
                           bn.settings.slope, kiln::as_tensor(*args->grad_output), x, args);
    const at::Tensor weight = optional_view(args->weight);
    if (!through_relu &&
        !kiln::norm::cudnn::backward(args, x, grad_output, weight, bn.eps, grads)) {
      grads = at::native_batch_norm_backward(
          grad_output, x, weight, running_mean, running_var, optional_view(args->save_mean),
          optional_view(args->save_invstd), batch_stats, bn.eps, mask);
    }
    const auto& [grad_input, grad_weight, grad_bias] = grads;
    // Handed over where the host gave a result slot (ABI 1.3), else copied into its buffer; a
    // slot is only read from arguments that have the field.
    const bool slots =
        bn.hands_over && KILN_HAS_FIELD(args, kiln_norm_backward_args, grad_bias_result);
    auto give = [&](DLManagedTensor** slot, DLTensor* buffer, const at::Tensor& grad) {
      if (slot != nullptr) {
        kiln::hand_over(slot, grad);
      } else if (buffer != nullptr) {
        kiln::as_tensor(*buffer).copy_(grad);
      }
    };
    give(slots ? args->grad_input_result : nullptr, args->grad_input, grad_input);
    give(slots ? args->grad_weight_result : nullptr, args->grad_weight, grad_weight);
    give(slots ? args->grad_bias_result : nullptr, args->grad_bias, grad_bias);
  });
}

const kiln_norm_vtable kVtable = {sizeof(kiln_norm_vtable), bn_create, bn_destroy, bn_forward,
                                  bn_backward};

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "momentum", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.1", nullptr,
     "weight of the batch statistics in the running-statistics update"},
    {sizeof(kiln_option_spec), "eps", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "1e-5", nullptr,
     "added to the variance for numerical stability (> 0)"},
    {sizeof(kiln_option_spec), "affine", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "true", nullptr,
     "learn a per-channel scale and shift"},
    {sizeof(kiln_option_spec), "track_running_stats", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "true",
     nullptr, "keep running mean and variance for evaluation"},
    {sizeof(kiln_option_spec), "fused", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "true", nullptr,
     "float32 on the CPU: Kiln's fused kernels (statistics, normalisation and a relu or "
     "leaky_relu in two passes, backward in two); CUDA training with a relu: cuDNN's batch norm "
     "+ relu kernels on half channels-last data; false: ATen's batch-norm kernels with a "
     "separate activation, bit for bit torch's"},
};

const kiln_capabilities kCaps = {sizeof(kiln_capabilities),
                                 KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32 |
                                     KILN_CAP_DTYPE_F16 | KILN_CAP_DTYPE_BF16,
                                 0, nullptr};

const kiln_component_descriptor kBatchNorm = {sizeof(kiln_component_descriptor),
                                              KILN_COMPONENT_NORM,
                                              0,
                                              "batchnorm",
                                              {1, 0, 0},
                                              "batch normalisation as torch.nn.BatchNorm2d",
                                              &kCaps,
                                              sizeof(kOptions) / sizeof(kOptions[0]),
                                              kOptions,
                                              &kVtable};

const kiln_component_descriptor* const kComponents[] = {&kBatchNorm};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-batchnorm", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
