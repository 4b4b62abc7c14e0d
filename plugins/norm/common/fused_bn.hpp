// A batch-norm layer's forward and backward on the fused CPU kernels (fused_cpu.hpp): the
// statistics applied, the running-statistics update (or the report to the host), the saved
// statistics and the gradients, as ATen's native_batch_norm(_backward) followed by the
// activation would give them.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "fused_cpu.hpp"
#include "kiln/torch.hpp"

namespace kiln::norm::fused {

struct BnSettings {
  double eps = 1e-5;
  double momentum = 0.1;
  bool track_running_stats = true;
  // The activation after the affine map as a negative-side slope: 0 ReLU, 1 none (fused_cpu.hpp).
  float slope = 1.0F;
  const char* plugin = "batchnorm";
};

// The negative-side slope the layer applies itself (kiln_norm_layout.fused_activation): a ReLU
// or leaky ReLU when the run trains on the CPU (or the host did not say, ABI < 1.9) and
// `enabled`; false otherwise (no activation, ELU, CUDA, where the host applies it after ATen's
// kernels as before).
bool fused_slope(const kiln_norm_setup* setup, bool enabled, float& slope);

// What the kernels apply per channel, (x − mean)·scale + bias, from the float32 statistics the
// layer saves (weight, bias absent: 1, 0), so backward derives exactly the forward's values and
// recomputes the same activation mask.
struct Affine {
  std::vector<float> mean, scale, bias;
};
Affine affine(const DLTensor* weight, const DLTensor* bias, std::vector<float> mean,
              const std::vector<float>& invstd);

// [C] float32 values of an argument on any device (absent: `fallback`).
std::vector<float> channel_values(const DLTensor* t, int64_t channels, float fallback);

// The layout of the saved input `x` for the backward kernels, with `dy` made dense in it when it
// came in another (a pooling's backward hands NCHW gradients to channels-last layers: one copy
// costs less than ATen's mixed-layout kernels). False when the kernels cannot take them.
bool backward_layout(const at::Tensor& x, at::Tensor& dy, Layout& l);

// ATen's path for data the kernels do not take (CUDA, half precision, mixed layouts) in a layer
// that applies its activation: the activation in place on the output ...
void activate_(float slope, at::Tensor& y);
// ... and the gradient at the activation's input: from the output, where the host kept it
// (KILN_NORM_SAVE_INPUT_AND_OUTPUT), else from that input recomputed from the saved input and
// statistics.
at::Tensor through_activation(float slope, const at::Tensor& grad, const at::Tensor& x,
                              const kiln_norm_backward_args* args);

// Runs the forward on the CPU kernels when the input and output allow (CPU float32, one dense
// layout, float32 [C] arguments); returns false, having written nothing, otherwise.
bool forward(const BnSettings& s, const kiln_norm_forward_args* args);

// Runs the backward on the CPU kernels when grad_output and the saved input allow; returns false,
// having written nothing, otherwise. `hands_over`: the layer's layout set hands_over_gradients.
bool backward(const BnSettings& s, const kiln_norm_backward_args* args, bool hands_over);

}  // namespace kiln::norm::fused
