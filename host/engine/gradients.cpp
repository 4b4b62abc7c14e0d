#include "engine/gradients.hpp"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_foreach_clamp_max.h>
#include <ATen/ops/_foreach_clamp_min.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/clamp_max.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <utility>

#include "engine/cpu_grad_norm.hpp"

namespace kiln::engine {
namespace {

// Gradients of one device and dtype: the unit of a multi-tensor kernel call.
struct Bucket {
  c10::Device device;
  at::ScalarType dtype;
  std::vector<at::Tensor> list;
};

// Checks every bucket (unscaling by `inv_scale` first when it is defined), then takes the
// global p-norm: multi-tensor kernels per bucket, no host read. Returns, on `device`, float32
// [found_inf, norm] with the loss appended when `loss` is defined.
at::Tensor launch_check(std::vector<Bucket>& buckets, c10::Device device,
                        const at::Tensor& inv_scale, double norm_type, const at::Tensor& loss) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  // found_inf accumulates over every bucket; the kernel checks and multiplies by inv_scale.
  at::Tensor found_inf = at::zeros({1}, f32);
  if (inv_scale.defined()) {
    for (auto& b : buckets) {
      const bool home = b.device == device;
      at::Tensor bucket_inf = home ? found_inf : at::zeros({1}, f32.device(b.device));
      at::Tensor bucket_inv = home ? inv_scale : inv_scale.to(b.device);
      at::_amp_foreach_non_finite_check_and_unscale_(b.list, bucket_inf, bucket_inv);
      if (!home) found_inf.add_(bucket_inf.to(device));
    }
  }
  std::vector<at::Tensor> norms;
  for (auto& b : buckets) {
    for (auto& n : at::_foreach_norm(b.list, norm_type, at::kFloat)) norms.push_back(n.to(device));
  }
  at::Tensor total = at::linalg_vector_norm(at::stack(norms), norm_type);
  std::vector<at::Tensor> parts{found_inf, total.reshape({1})};
  if (loss.defined()) parts.push_back(loss.reshape({1}).to(device, at::kFloat));
  return at::cat(parts);
}

// Unscales by 1/scale, checks and takes the norm, and reads the numbers back in one copy.
GradCheck norm_and_check(std::vector<Bucket>& buckets, c10::Device device, double scale,
                         const ClipSettings& clip, const at::Tensor& loss) {
  // Unscaled (scale 1) the pass would only multiply by 1: a p-norm with p > 0 turns non-finite
  // on any inf or NaN, and a non-finite norm fails the check either way.
  at::Tensor inv_scale;
  if (scale != 1.0 || !(clip.norm_type > 0.0)) {
    inv_scale = at::full({1}, 1.0 / scale, at::TensorOptions().dtype(at::kFloat).device(device));
  }
  return read_gradient_check(launch_check(buckets, device, inv_scale, clip.norm_type, loss));
}

// The fused kernels take one device and one dtype per call (few buckets: a linear search).
std::vector<Bucket> by_device_and_dtype(const std::vector<at::Tensor>& grads) {
  std::vector<Bucket> buckets;
  for (const at::Tensor& g : grads) {
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
      return b.device == g.device() && b.dtype == g.scalar_type();
    });
    if (it == buckets.end())
      it = buckets.insert(buckets.end(), Bucket{g.device(), g.scalar_type(), {}});
    it->list.push_back(g);
  }
  return buckets;
}

bool all_dense_cpu_float(const std::vector<at::Tensor>& grads) {
  return std::all_of(grads.begin(), grads.end(), [](const at::Tensor& g) {
    return g.device().is_cpu() && g.scalar_type() == at::kFloat && g.layout() == at::kStrided &&
           g.is_contiguous();
  });
}

}  // namespace

at::Tensor launch_gradient_check(const std::vector<at::Tensor>& tensors,
                                 const at::Tensor& inv_scale, double norm_type,
                                 const at::Tensor& loss) {
  std::vector<at::Tensor> grads;
  for (const auto& t : tensors) {
    if (t.grad().defined()) grads.push_back(t.grad());
  }
  if (grads.empty()) throw std::invalid_argument("launch_gradient_check: no gradients");
  std::vector<Bucket> buckets = by_device_and_dtype(grads);
  return launch_check(buckets, grads.front().device(), inv_scale, norm_type, loss);
}

GradCheck read_gradient_check(const at::Tensor& readout) {
  const at::Tensor values = readout.to(at::kCPU, at::kFloat).contiguous();
  const float* v = values.const_data_ptr<float>();
  GradCheck result;
  result.finite = v[0] == 0.0f && std::isfinite(v[1]);
  result.norm = v[1];
  if (values.numel() > 2) result.loss = v[2];
  return result;
}

void clip_on_device(const std::vector<at::Tensor>& tensors, const at::Tensor& norm,
                    const ClipSettings& clip) {
  if (!clip.any()) return;
  std::vector<at::Tensor> grads;
  for (const auto& t : tensors) {
    if (t.grad().defined()) grads.push_back(t.grad());
  }
  std::vector<Bucket> buckets = by_device_and_dtype(grads);
  if (clip.max_norm > 0.0) {
    // torch.nn.utils.clip_grad_norm_'s coefficient (1e-6 included), clamped to 1 as its
    // foreach path does instead of testing it on the host; 1 for a non-finite norm, so that a
    // skipped step's gradients keep their values and the host can name the offending ones.
    const at::Tensor n = norm.to(at::kFloat).reshape({});
    const at::Tensor coef = at::where(
        at::isfinite(n), at::clamp_max(at::reciprocal(n + 1e-6) * clip.max_norm, 1.0), 1.0);
    for (auto& b : buckets) at::_foreach_mul_(b.list, coef.to(b.device));
  }
  if (clip.max_value > 0.0) {
    for (auto& b : buckets) {
      at::_foreach_clamp_min_(b.list, -clip.max_value);
      at::_foreach_clamp_max_(b.list, clip.max_value);
    }
  }
}

GradCheck clip_after_check(GradCheck result, const std::vector<at::Tensor>& tensors,
                           const std::vector<std::string>& names, const ClipSettings& clip,
                           size_t name_limit) {
  if (!result.finite) {
    for (size_t i = 0; i < tensors.size() && result.non_finite.size() < name_limit; ++i) {
      const at::Tensor& g = tensors[i].grad();
      if (g.defined() && !at::isfinite(g).all().item<bool>()) {
        result.non_finite.push_back(i < names.size() ? names[i] : "#" + std::to_string(i));
      }
    }
    return result;
  }
  if (!clip.any()) return result;
  std::vector<at::Tensor> grads;
  for (const auto& t : tensors) {
    if (t.grad().defined()) grads.push_back(t.grad());
  }
  std::vector<Bucket> buckets = by_device_and_dtype(grads);
  if (clip.max_norm > 0.0) {
    // torch.nn.utils.clip_grad_norm_'s coefficient, 1e-6 included.
    const double coef = clip.max_norm / (result.norm + 1e-6);
    if (coef < 1.0) {
      for (auto& b : buckets) at::_foreach_mul_(b.list, coef);
    }
  }
  if (clip.max_value > 0.0) {
    for (auto& b : buckets) {
      at::_foreach_clamp_min_(b.list, -clip.max_value);
      at::_foreach_clamp_max_(b.list, clip.max_value);
    }
  }
  return result;
}

GradCheck check_loss_only(const std::vector<at::Tensor>& tensors,
                          const std::vector<std::string>& names, const at::Tensor& loss,
                          size_t name_limit) {
  if (!loss.defined()) throw std::invalid_argument("check_loss_only: no loss");
  GradCheck result;
  result.measured = false;
  result.norm = NAN;
  result.loss = loss.item<double>();
  result.finite = std::isfinite(result.loss);
  // clip_after_check names the offending gradients of a failed check; a passed one without
  // clipping is returned as it is.
  return clip_after_check(std::move(result), tensors, names, ClipSettings{}, name_limit);
}

GradCheck unscale_check_clip(const std::vector<at::Tensor>& tensors,
                             const std::vector<std::string>& names, double scale,
                             const ClipSettings& clip, const at::Tensor& loss, size_t name_limit) {
  std::vector<at::Tensor> grads;
  grads.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.grad().defined()) grads.push_back(t.grad());
  }
  GradCheck result;
  if (grads.empty()) {
    if (loss.defined()) result.loss = loss.item<double>();
    return result;
  }
  if (scale == 1.0 && clip.norm_type == 2.0 && all_dense_cpu_float(grads)) {
    // Unscaled float32 on the CPU (fp32 training): one pass gives the norm and the check.
    result.norm = cpu_float_norm2(grads);
    result.finite = std::isfinite(result.norm);
    if (loss.defined()) result.loss = loss.item<double>();
  } else {
    std::vector<Bucket> buckets = by_device_and_dtype(grads);
    result = norm_and_check(buckets, grads.front().device(), scale, clip, loss);
  }
  return clip_after_check(std::move(result), tensors, names, clip, name_limit);
}

}  // namespace kiln::engine
