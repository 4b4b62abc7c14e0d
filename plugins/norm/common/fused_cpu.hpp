// Batch norm + activation fused on the CPU for float32 data, dense NCHW (N x C x ...) or
// channels-last (N x ... x C in memory). ATen runs a training step's batch norm + ReLU as
// statistics, normalise, activation, activation backward, backward sums and backward
// elementwise: six passes over the data. These kernels take four: one pass gathers the
// per-channel moments, one normalises, applies the affine map and the activation; backward is
// one reducing pass and one elementwise pass, with the activation's mask recomputed from the
// input (which the layer keeps anyway) instead of read from a kept output.
//
// The activation is a slope on the negative side: 0 is ReLU, 1 the identity, anything else a
// leaky ReLU. Per-channel values (scale, bias, the backward's coefficients) are float32 [C]
// arrays the caller derives in double and rounds; `bias` is the affine bias, applied after
// the scaled deviation from the channel's mean.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace kiln::norm::fused {

// How a tensor's N x C x ... elements lie in memory, when the kernels take it.
struct Layout {
  bool channels_last = false;  // rows of C values (N·spatial rows); else N planes of C·inner
  int64_t n = 0;               // samples
  int64_t channels = 0;
  int64_t inner = 0;  // spatial values per sample and channel (1 for N x C)
  int64_t rows() const { return n * inner; }
  double count() const { return static_cast<double>(n) * static_cast<double>(inner); }
};

// The layout of `x` when every tensor of `same` (and `x`) is a CPU float32 tensor of x's sizes
// and strides, dense in either layout; false otherwise (the caller then takes ATen's path).
bool layout_of(const at::Tensor& x, std::initializer_list<at::Tensor> same, Layout& out);

// Per-channel count, mean and M2 (sum of squared deviations) in double, one pass over `x`.
void moments(const float* x, const Layout& l, double* mean, double* m2);

// y = act((x − mean) · scale + bias) per channel (centred, so that inputs far from zero lose no
// digits); `y` may be `x`.
void normalise(const float* x, float* y, const Layout& l, const float* mean, const float* scale,
               const float* bias, float slope);

// Backward's per-channel sums, over dz = dy · act'((x − mean) · scale + bias):
// sum_dz = Σ dz, sum_dz_xc = Σ dz · (x − mean).
void grad_sums(const float* dy, const float* x, const Layout& l, const float* scale,
               const float* bias, float slope, const float* mean, double* sum_dz,
               double* sum_dz_xc);

// dx = dz · a + (x − mean) · b + c per channel, dz as in grad_sums (centred, so that inputs far
// from zero lose no digits); `dx` may be `dy`.
void grad_input(const float* dy, const float* x, float* dx, const Layout& l, const float* scale,
                const float* bias, float slope, const float* mean, const float* a, const float* b,
                const float* c);

}  // namespace kiln::norm::fused
