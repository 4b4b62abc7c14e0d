#include "data/mix.hpp"

#include <ATen/ops/flip.h>
#include <ATen/ops/full.h>

#include <algorithm>
#include <cmath>

#include "data/transforms.hpp"

namespace kiln::data {

namespace {

// Standard normal by Box-Muller (one of the pair; the draws stay in lock-step).
double normal(std::mt19937_64& gen) {
  const double u1 = 1.0 - uniform(gen, 0.0, 1.0);  // (0, 1]: the log stays finite
  const double u2 = uniform(gen, 0.0, 1.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace

double sample_gamma(std::mt19937_64& gen, double alpha) {
  if (alpha < 1.0) {
    // Gamma(a) = Gamma(a + 1) * U^(1/a).
    const double u = 1.0 - uniform(gen, 0.0, 1.0);
    return sample_gamma(gen, alpha + 1.0) * std::pow(u, 1.0 / alpha);
  }
  const double d = alpha - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x = 0.0, v = 0.0;
    do {
      x = normal(gen);
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = uniform(gen, 0.0, 1.0);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

double sample_beta(std::mt19937_64& gen, double a, double b) {
  const double x = sample_gamma(gen, a), y = sample_gamma(gen, b);
  return x + y > 0.0 ? x / (x + y) : 0.5;
}

MixParams cutmix_box(int64_t height, int64_t width, double lambda, std::mt19937_64& gen) {
  const double ratio = std::sqrt(1.0 - lambda);
  const auto cut_h = static_cast<int64_t>(static_cast<double>(height) * ratio);
  const auto cut_w = static_cast<int64_t>(static_cast<double>(width) * ratio);
  const int64_t cy = randint(gen, 0, height), cx = randint(gen, 0, width);
  MixParams p;
  p.cutmix = true;
  p.y0 = std::clamp<int64_t>(cy - cut_h / 2, 0, height);
  p.y1 = std::clamp<int64_t>(cy + cut_h / 2, 0, height);
  p.x0 = std::clamp<int64_t>(cx - cut_w / 2, 0, width);
  p.x1 = std::clamp<int64_t>(cx + cut_w / 2, 0, width);
  p.lambda = 1.0 - static_cast<double>((p.y1 - p.y0) * (p.x1 - p.x0)) /
                       static_cast<double>(height * width);
  return p;
}

MixParams draw_mix(const MixOptions& o, int64_t height, int64_t width, std::mt19937_64& gen) {
  MixParams p;
  if (!o.enabled() || !(uniform(gen, 0.0, 1.0) < o.prob)) return p;
  bool cutmix = false;
  double lambda = 1.0;
  if (o.mixup_alpha > 0.0 && o.cutmix_alpha > 0.0) {
    cutmix = uniform(gen, 0.0, 1.0) < o.switch_prob;
    const double a = cutmix ? o.cutmix_alpha : o.mixup_alpha;
    lambda = sample_beta(gen, a, a);
  } else if (o.mixup_alpha > 0.0) {
    lambda = sample_beta(gen, o.mixup_alpha, o.mixup_alpha);
  } else {
    cutmix = true;
    lambda = sample_beta(gen, o.cutmix_alpha, o.cutmix_alpha);
  }
  if (lambda == 1.0) return p;  // timm returns before drawing a box
  if (cutmix) return cutmix_box(height, width, lambda, gen);
  p.lambda = lambda;
  return p;
}

void apply_mix(at::Tensor& images, const MixParams& p) {
  if (p.lambda == 1.0) return;
  if (p.cutmix) {
    if (p.y1 <= p.y0 || p.x1 <= p.x0) return;
    at::Tensor region = images.slice(2, p.y0, p.y1).slice(3, p.x0, p.x1);
    region.copy_(at::flip(region, {0}));  // flip() copies first: no aliasing
    return;
  }
  at::Tensor flipped = at::flip(images, {0}).mul_(1.0 - p.lambda);
  images.mul_(p.lambda).add_(flipped);
}

at::Tensor mix_targets(const at::Tensor& labels, int64_t num_classes, double lambda,
                       double smoothing) {
  const double off = smoothing / static_cast<double>(num_classes);
  const double on = 1.0 - smoothing + off;
  const int64_t n = labels.size(0);
  at::Tensor y1 = at::full({n, num_classes}, off, at::kFloat);
  at::Tensor y2 = at::full({n, num_classes}, off, at::kFloat);
  const at::Tensor index = labels.view({n, 1});
  y1.scatter_(1, index, on);
  y2.scatter_(1, at::flip(index, {0}), on);
  return y1.mul_(lambda).add_(y2.mul_(1.0 - lambda));
}

at::Tensor mix_rows(const at::Tensor& rows, double lambda) {
  at::Tensor flipped = at::flip(rows, {0}).mul_(1.0 - lambda);
  return rows.mul(lambda).add_(flipped);
}

}  // namespace kiln::data
