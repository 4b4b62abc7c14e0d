#include "fused_bn.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/leaky_relu.h>
#include <ATen/ops/leaky_relu_backward.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/threshold_backward.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "fused_cpu.hpp"
#include "report.hpp"

namespace kiln::norm::fused {
namespace {

bool dense_f32(const at::Tensor& t, int64_t channels) {
  return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 1 &&
         t.size(0) == channels && t.is_contiguous();
}

// A [C] argument the kernels can read in place (CPU float32, dense), or absent.
bool readable(const DLTensor* t, int64_t channels) {
  return t == nullptr || dense_f32(kiln::as_tensor(*t), channels);
}

std::vector<float> values(const DLTensor* t, int64_t channels, float fallback) {
  std::vector<float> out(static_cast<size_t>(channels), fallback);
  if (t != nullptr) {
    const float* p = static_cast<const float*>(t->data) + t->byte_offset / sizeof(float);
    std::memcpy(out.data(), p, out.size() * sizeof(float));
  }
  return out;
}

void write(const DLTensor* t, const std::vector<float>& v) {
  if (t == nullptr) return;
  float* p = static_cast<float*>(t->data) + t->byte_offset / sizeof(float);
  std::memcpy(p, v.data(), v.size() * sizeof(float));
}

at::Tensor channel_tensor(std::vector<float>& v) {
  return at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kFloat);
}

// Like torch.nn.BatchNorm: without running statistics, batch statistics are used in eval too.
bool batch_statistics(const BnSettings& s, int32_t training, const DLTensor* running_mean,
                      const DLTensor* running_var) {
  return training != 0 || !s.track_running_stats || running_mean == nullptr ||
         running_var == nullptr;
}

}  // namespace

bool fused_slope(const kiln_norm_setup* setup, bool enabled, float& slope) {
  const bool cpu = !KILN_HAS_FIELD(setup, kiln_norm_setup, device_type) ||
                   setup->device_type == 0 || setup->device_type == kDLCPU;
  slope = 1.0F;
  if (!enabled || !cpu) return false;
  if (setup->activation == KILN_ACT_RELU) {
    slope = 0.0F;
    return true;
  }
  if (setup->activation == KILN_ACT_LEAKY_RELU) {
    slope = static_cast<float>(setup->activation_param);
    return true;
  }
  return false;
}

bool backward_layout(const at::Tensor& x, at::Tensor& dy, Layout& l) {
  if (layout_of(x, {dy}, l)) return true;
  if (!layout_of(x, {}, l) || !dy.device().is_cpu() || dy.scalar_type() != at::kFloat ||
      dy.sizes() != x.sizes()) {
    return false;
  }
  dy = dy.contiguous(x.suggest_memory_format());
  return layout_of(x, {dy}, l);
}

std::vector<float> channel_values(const DLTensor* t, int64_t channels, float fallback) {
  if (t == nullptr || readable(t, channels)) return values(t, channels, fallback);
  at::Tensor v = kiln::as_tensor(*t).to(at::kCPU, at::kFloat).contiguous();
  return std::vector<float>(v.data_ptr<float>(), v.data_ptr<float>() + channels);
}

Affine affine(const DLTensor* weight, const DLTensor* bias, std::vector<float> mean,
              const std::vector<float>& invstd) {
  const auto c = static_cast<int64_t>(mean.size());
  Affine out{std::move(mean), channel_values(weight, c, 1.0F), channel_values(bias, c, 0.0F)};
  for (int64_t i = 0; i < c; ++i) {
    out.scale[i] = static_cast<float>(static_cast<double>(out.scale[i]) * invstd[i]);
  }
  return out;
}

void activate_(float slope, at::Tensor& y) {
  if (slope == 1.0F) return;
  if (slope == 0.0F) {
    at::relu_(y);
  } else {
    at::leaky_relu_(y, slope);
  }
}

at::Tensor through_activation(float slope, const at::Tensor& grad, const at::Tensor& x,
                              const kiln_norm_backward_args* args) {
  if (slope == 1.0F) return grad;
  // The output the host kept (ABI 1.12): the activation's backward from it, as torch's in-place
  // activation keeps its result (a negative slope would not tell the sides apart).
  if (KILN_HAS_FIELD(args, kiln_norm_backward_args, saved_output) &&
      args->saved_output != nullptr && slope >= 0.0F) {
    const at::Tensor y = kiln::as_tensor(*args->saved_output);
    if (slope == 0.0F) return at::threshold_backward(grad, y, 0);
    return at::leaky_relu_backward(grad, y, slope, /*self_is_result=*/true);
  }
  const int64_t c = x.size(1);
  Affine f = affine(args->weight, args->bias, channel_values(args->save_mean, c, 0.0F),
                    channel_values(args->save_invstd, c, 1.0F));
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[1] = c;
  auto per_channel = [&](std::vector<float>& v) {
    return channel_tensor(v).view(shape).to(x.device(), x.scalar_type());
  };
  const at::Tensor pre = (x - per_channel(f.mean)) * per_channel(f.scale) + per_channel(f.bias);
  if (slope == 0.0F) return at::threshold_backward(grad, pre, 0);
  return at::leaky_relu_backward(grad, pre, slope, /*self_is_result=*/false);
}

bool forward(const BnSettings& s, const kiln_norm_forward_args* args) {
  const at::Tensor x = kiln::as_tensor(*args->input);
  at::Tensor y = kiln::as_tensor(*args->output);
  Layout l;
  if (!layout_of(x, {y}, l)) return false;
  const int64_t c = l.channels;
  const bool batch = batch_statistics(s, args->training, args->running_mean, args->running_var);
  kiln_norm_batch_stats* report =
      args->training != 0 && batch ? kiln::norm::report_request(args, s.plugin) : nullptr;
  // Running statistics move in training, unless the host asked for a report instead.
  const bool update = args->training != 0 && batch && s.track_running_stats && report == nullptr;
  for (const DLTensor* t : {args->weight, args->bias, static_cast<const DLTensor*>(args->save_mean),
                            static_cast<const DLTensor*>(args->save_invstd)}) {
    if (!readable(t, c)) return false;
  }
  if ((!batch || update) && !(readable(args->running_mean, c) && readable(args->running_var, c))) {
    return false;
  }

  std::vector<float> mean(c), invstd(c);
  std::vector<double> batch_mean(c), m2(c);
  if (batch) {
    moments(x.data_ptr<float>(), l, batch_mean.data(), m2.data());
    const double n = l.count();
    for (int64_t i = 0; i < c; ++i) {
      mean[i] = static_cast<float>(batch_mean[i]);
      invstd[i] = static_cast<float>(1.0 / std::sqrt(m2[i] / n + s.eps));
    }
  } else {
    const std::vector<float> rm = values(args->running_mean, c, 0.0F);
    const std::vector<float> rv = values(args->running_var, c, 1.0F);
    for (int64_t i = 0; i < c; ++i) {
      mean[i] = rm[i];
      invstd[i] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(rv[i]) + s.eps));
    }
  }
  const Affine f = affine(args->weight, args->bias, mean, invstd);
  normalise(x.data_ptr<float>(), y.data_ptr<float>(), l, f.mean.data(), f.scale.data(),
            f.bias.data(), s.slope);
  write(args->save_mean, mean);
  write(args->save_invstd, invstd);

  if (!(args->training != 0 && batch)) return true;
  // The unbiased variance, as torch's running_var takes it.
  const double n = l.count();
  std::vector<float> unbiased(c);
  for (int64_t i = 0; i < c; ++i) unbiased[i] = static_cast<float>(m2[i] / (n - 1.0));
  if (report != nullptr) {
    kiln::norm::report_stats(report, n, channel_tensor(mean), channel_tensor(unbiased), s.momentum);
  } else if (update && args->running_mean != nullptr && args->running_var != nullptr) {
    std::vector<float> rm = values(args->running_mean, c, 0.0F);
    std::vector<float> rv = values(args->running_var, c, 1.0F);
    for (int64_t i = 0; i < c; ++i) {
      rm[i] = static_cast<float>(s.momentum * batch_mean[i] + (1.0 - s.momentum) * rm[i]);
      rv[i] = static_cast<float>(s.momentum * (m2[i] / (n - 1.0)) + (1.0 - s.momentum) * rv[i]);
    }
    write(args->running_mean, rm);
    write(args->running_var, rv);
  }
  return true;
}

bool backward(const BnSettings& s, const kiln_norm_backward_args* args, bool hands_over) {
  if (args->saved == nullptr || args->save_mean == nullptr || args->save_invstd == nullptr) {
    return false;
  }
  const at::Tensor x = kiln::as_tensor(*args->saved);
  at::Tensor dy = kiln::as_tensor(*args->grad_output);
  Layout l;
  if (!backward_layout(x, dy, l)) return false;
  const int64_t c = l.channels;
  for (const DLTensor* t : {args->weight, args->bias, args->save_mean, args->save_invstd}) {
    if (!readable(t, c)) return false;
  }
  const std::vector<float> weight = values(args->weight, c, 1.0F);
  const std::vector<float> mean = values(args->save_mean, c, 0.0F);
  const std::vector<float> invstd = values(args->save_invstd, c, 1.0F);
  const Affine f = affine(args->weight, args->bias, mean, invstd);

  std::vector<double> sum_dz(c), sum_dz_xc(c);
  grad_sums(dy.data_ptr<float>(), x.data_ptr<float>(), l, f.scale.data(), f.bias.data(), s.slope,
            mean.data(), sum_dz.data(), sum_dz_xc.data());
  std::vector<float> grad_weight(c), grad_bias(c);
  for (int64_t i = 0; i < c; ++i) {
    grad_weight[i] = static_cast<float>(sum_dz_xc[i] * invstd[i]);
    grad_bias[i] = static_cast<float>(sum_dz[i]);
  }

  // dx = w·invstd·(dz − mean(dz) − xhat·mean(dz·xhat)) with batch statistics, w·invstd·dz with
  // fixed ones; as dz·a + (x − mean)·b + c per channel.
  const bool batch = batch_statistics(s, args->training, args->running_mean, args->running_var);
  const double n = l.count();
  std::vector<float> a(c), b(c, 0.0F), k(c, 0.0F);
  for (int64_t i = 0; i < c; ++i) {
    const double gain = static_cast<double>(weight[i]) * invstd[i];
    a[i] = static_cast<float>(gain);
    if (batch && n > 0) {
      const double bi = -gain * invstd[i] * invstd[i] * sum_dz_xc[i] / n;
      b[i] = static_cast<float>(bi);
      k[i] = static_cast<float>(-gain * sum_dz[i] / n);
    }
  }
  at::Tensor dx;
  bool into_buffer = false;
  if (args->grad_input != nullptr) {
    // The host's buffer when it has the input's layout; otherwise (handed over, or a buffer laid
    // out as a gradient that came in another layout) a tensor like the input, given below.
    Layout same;
    into_buffer = !hands_over && layout_of(x, {kiln::as_tensor(*args->grad_input)}, same);
    dx = into_buffer ? kiln::as_tensor(*args->grad_input) : at::empty_like(x);
    grad_input(dy.data_ptr<float>(), x.data_ptr<float>(), dx.data_ptr<float>(), l, f.scale.data(),
               f.bias.data(), s.slope, mean.data(), a.data(), b.data(), k.data());
  }
  const bool slots = hands_over && KILN_HAS_FIELD(args, kiln_norm_backward_args, grad_bias_result);
  auto give = [&](DLManagedTensor** slot, DLTensor* buffer, const at::Tensor& grad) {
    if (slot != nullptr) {
      kiln::hand_over(slot, grad);
    } else if (buffer != nullptr) {
      kiln::as_tensor(*buffer).copy_(grad);
    }
  };
  if (args->grad_input != nullptr && !into_buffer) {
    give(slots ? args->grad_input_result : nullptr, args->grad_input, dx);
  }
  if (args->grad_weight != nullptr) {
    give(slots ? args->grad_weight_result : nullptr, args->grad_weight,
         channel_tensor(grad_weight).clone());
  }
  if (args->grad_bias != nullptr) {
    give(slots ? args->grad_bias_result : nullptr, args->grad_bias,
         channel_tensor(grad_bias).clone());
  }
  return true;
}

}  // namespace kiln::norm::fused
