// Per-channel statistics of N x C x ... inputs in float32 (also for half inputs), computed in
// chunks of samples so the float32 temporaries stay small, and combined across parts with Chan
// et al.'s parallel formula.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/torch.hpp"

namespace kiln::norm {

// Largest float32 temporary (elements) an elementwise pass over a chunk of samples creates.
inline constexpr int64_t kChunkElements = int64_t{1} << 18;

// An at::Tensor view of an optional argument (undefined when absent).
at::Tensor optional_view(const DLTensor* t);

// Throws unless `x` is N x `features` x ...
void check_input(const at::Tensor& x, int64_t features, const char* plugin);

// The dimensions statistics reduce over: {0, 2, 3, ...}.
std::vector<int64_t> reduce_dims(const at::Tensor& x);

// [C] -> [1, C, 1, ...] broadcastable against a `dim`-dimensional input.
at::Tensor per_channel(const at::Tensor& v, int64_t dim);

// Calls fn(first, count) for consecutive ranges of samples (dimension 0) holding at most
// kChunkElements elements each (at least one sample).
void for_each_chunk(const at::Tensor& x, const std::function<void(int64_t, int64_t)>& fn);

// A [C] argument as float32 on `like`'s device, or `fallback` everywhere when absent.
at::Tensor channel_f32(const DLTensor* t, int64_t channels, double fallback,
                       const at::Tensor& like);

// Count, mean and sum of squared deviations (M2) per channel; mean and m2 are float64 [C]:
// the data is reduced in float32, but the few per-channel values that combine parts and derive
// scale and shift are kept in double so close-together parts do not lose digits.
struct Moments {
  double count = 0;
  at::Tensor mean;
  at::Tensor m2;
};

// This process's moments of `x` (count 0 and zeros for an empty batch).
Moments local_moments(const at::Tensor& x);

// [count, mean(C), m2(C)] as one float32 vector, the unit ranks exchange.
at::Tensor pack(const Moments& m);

// Combines rows [k, 1 + 2C] of packed moments: Chan's formula for k parts,
// mean = sum(n_i mean_i) / N, M2 = sum(M2_i) + sum(n_i (mean_i - mean)^2). Parts with n_i = 0
// contribute nothing.
Moments combine(const at::Tensor& rows);

// Momentum update of the running statistics with the unbiased variance M2 / (N - 1).
void update_running(const at::Tensor& running_mean, const at::Tensor& running_var, const Moments& m,
                    double momentum);

// Throws unless there is more than one value per channel (training statistics need two).
void check_count(const Moments& m, const at::Tensor& x, int32_t world, const char* plugin);

}  // namespace kiln::norm
