// Mixup and CutMix with timm's semantics (timm.data.Mixup, mode "batch"): one lambda per batch,
// each sample mixed with the batch flipped (x.flip(0)); the targets become soft, N x classes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>

namespace kiln::data {

struct MixOptions {
  double mixup_alpha = 0.0;   // Beta(a, a) for mixup's lambda; 0 = off
  double cutmix_alpha = 0.0;  // Beta(a, a) for cutmix's lambda; 0 = off
  double prob = 1.0;          // chance that a batch is mixed at all
  double switch_prob = 0.5;   // with both on: chance of cutmix rather than mixup
  double label_smoothing = 0.0;
  bool enabled() const { return mixup_alpha > 0.0 || cutmix_alpha > 0.0; }
};

// One batch's draw: lambda (1 = unmixed), and for cutmix the box pasted from the flipped batch,
// rows [y0, y1) and columns [x0, x1), with lambda already corrected to the box's area.
struct MixParams {
  double lambda = 1.0;
  bool cutmix = false;
  int64_t y0 = 0, y1 = 0, x0 = 0, x1 = 0;
};

// Gamma(alpha, 1) and Beta(a, a) by Marsaglia and Tsang from the generator alone (the same on
// every platform, unlike std::gamma_distribution).
double sample_gamma(std::mt19937_64& gen, double alpha);
double sample_beta(std::mt19937_64& gen, double a, double b);

// timm's rand_bbox(margin 0) and correct_lam for a lambda drawn elsewhere: cut = int(side *
// sqrt(1 - lambda)), centre uniform over the image, edges clipped; lambda = 1 - box / image.
MixParams cutmix_box(int64_t height, int64_t width, double lambda, std::mt19937_64& gen);

// timm's _params_per_batch, then the box for cutmix on a height x width batch.
MixParams draw_mix(const MixOptions& options, int64_t height, int64_t width, std::mt19937_64& gen);

// Mixes `images` (N x C x H x W float) in place with images.flip(0), as timm's _mix_batch.
void apply_mix(at::Tensor& images, const MixParams& params);

// timm's mixup_target: one-hot(labels) x lambda + one-hot(labels.flip(0)) x (1 - lambda), with
// label smoothing; float32 N x num_classes.
at::Tensor mix_targets(const at::Tensor& labels, int64_t num_classes, double lambda,
                       double smoothing);

// The same mix of target rows already given (multi-label data): rows x lambda + rows.flip(0) x
// (1 - lambda); float32 N x classes.
at::Tensor mix_rows(const at::Tensor& rows, double lambda);

}  // namespace kiln::data
