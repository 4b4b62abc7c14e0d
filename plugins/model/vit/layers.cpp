#include "layers.hpp"

#include <ATen/ops/conv2d.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/init.h>

#include <cmath>

namespace kiln_vit {
namespace {

double normal_cdf(double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); }

}  // namespace

void trunc_normal_(at::Tensor& t, double std, double a, double b) {
  // Inverse-CDF sampling, as torch.nn.init.trunc_normal_: uniform over [Φ(a), Φ(b)], mapped back
  // through erfinv; the clamp guards the ends against rounding. `t` must not require grad yet.
  const double lo = normal_cdf(a / std);
  const double hi = normal_cdf(b / std);
  t.uniform_(2.0 * lo - 1.0, 2.0 * hi - 1.0);
  t.erfinv_();
  t.mul_(std * std::sqrt(2.0));
  t.clamp_(a, b);
}

Linear::Linear(int64_t in_features, int64_t out_features) {
  at::Tensor weight = at::empty({out_features, in_features});
  // timm calls trunc_normal_(std=.02) with its default bounds a=-2, b=2 (absolute, i.e. 100σ),
  // so in effect a plain N(0, .02²); we keep those bounds to match timm's statistics.
  trunc_normal_(weight, 0.02, -2.0, 2.0);
  weight_ = register_parameter("weight", weight);
  bias_ = register_parameter("bias", at::zeros({out_features}));
}

at::Tensor Linear::forward(const at::Tensor& input) { return at::linear(input, weight_, bias_); }

LayerNorm::LayerNorm(int64_t features) : features_(features) {
  weight_ = register_parameter("weight", at::ones({features}));
  bias_ = register_parameter("bias", at::zeros({features}));
}

at::Tensor LayerNorm::forward(const at::Tensor& input) {
  const at::ScalarType dtype = weight_.scalar_type();
  if (input.scalar_type() == dtype) {
    return at::layer_norm(input, {features_}, weight_, bias_, kEps);
  }
  return at::layer_norm(input.to(dtype), {features_}, weight_, bias_, kEps).to(input.scalar_type());
}

PatchConv::PatchConv(int64_t in_channels, int64_t dim, int64_t patch) : patch_(patch) {
  at::Tensor weight = at::empty({dim, in_channels, patch, patch});
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_channels * patch * patch));
  weight_ = register_parameter("weight", weight);
  bias_ = register_parameter("bias", at::empty({dim}).uniform_(-bound, bound));
}

at::Tensor PatchConv::forward(const at::Tensor& input) {
  return at::conv2d(input, weight_, bias_, {patch_, patch_});
}

PatchEmbed::PatchEmbed(int64_t in_channels, int64_t dim, int64_t patch) {
  proj_ = register_module("proj", std::make_shared<PatchConv>(in_channels, dim, patch));
}

at::Tensor PatchEmbed::forward(const at::Tensor& input) {
  // [N, dim, h, w] → [N, h·w, dim].
  return proj_->forward(input).flatten(2).transpose(1, 2);
}

}  // namespace kiln_vit
