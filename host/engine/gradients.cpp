#include "engine/gradients.hpp"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_foreach_clamp_max.h>
#include <ATen/ops/_foreach_clamp_min.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>

namespace kiln::engine {

GradCheck unscale_check_clip(const std::vector<at::Tensor>& tensors,
                             const std::vector<std::string>& names, double scale,
                             const ClipSettings& clip, size_t name_limit) {
  // The fused kernels take one device and one dtype per call (few buckets: a linear search).
  struct Bucket {
    c10::Device device;
    at::ScalarType dtype;
    std::vector<at::Tensor> list;
  };
  std::vector<Bucket> buckets;
  std::vector<at::Tensor> grads;
  for (const auto& t : tensors) {
    const at::Tensor& g = t.grad();
    if (!g.defined()) continue;
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
      return b.device == g.device() && b.dtype == g.scalar_type();
    });
    if (it == buckets.end())
      it = buckets.insert(buckets.end(), Bucket{g.device(), g.scalar_type(), {}});
    it->list.push_back(g);
    grads.push_back(g);
  }
  GradCheck result;
  if (grads.empty()) return result;

  const c10::Device device = grads.front().device();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  // found_inf accumulates over every bucket; the kernel checks and multiplies by inv_scale.
  at::Tensor found_inf = at::zeros({1}, f32);
  auto check_and_unscale = [&](double inv) {
    at::Tensor inv_scale = at::full({1}, inv, f32);
    for (auto& b : buckets) {
      const bool home = b.device == device;
      at::Tensor bucket_inf = home ? found_inf : at::zeros({1}, f32.device(b.device));
      at::Tensor bucket_inv = home ? inv_scale : inv_scale.to(b.device);
      at::_amp_foreach_non_finite_check_and_unscale_(b.list, bucket_inf, bucket_inv);
      if (!home) found_inf.add_(bucket_inf.to(device));
    }
  };
  // Unscaled (scale 1) the pass would only multiply by 1: a p-norm with p > 0 turns non-finite
  // on any inf or NaN, and a non-finite norm fails the check either way.
  if (scale != 1.0 || !(clip.norm_type > 0.0)) check_and_unscale(1.0 / scale);
  std::vector<at::Tensor> norms;
  for (auto& b : buckets) {
    for (auto& n : at::_foreach_norm(b.list, clip.norm_type, at::kFloat)) {
      norms.push_back(n.to(device));
    }
  }
  at::Tensor total = at::linalg_vector_norm(at::stack(norms), clip.norm_type);
  // The two numbers the host needs, in one device-to-host copy.
  at::Tensor both = at::cat({found_inf, total.reshape({1})}).cpu();
  const float* values = both.data_ptr<float>();
  result.finite = values[0] == 0.0f && std::isfinite(values[1]);
  result.norm = values[1];

  if (!result.finite) {
    for (size_t i = 0; i < tensors.size() && result.non_finite.size() < name_limit; ++i) {
      const at::Tensor& g = tensors[i].grad();
      if (g.defined() && !at::isfinite(g).all().item<bool>()) {
        result.non_finite.push_back(i < names.size() ? names[i] : "#" + std::to_string(i));
      }
    }
    return result;
  }
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

}  // namespace kiln::engine
