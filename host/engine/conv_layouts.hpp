// Which convolutions of a channels-last model run NCHW on the CPU. oneDNN's NHWC kernels lose to
// its blocked NCHW ones (nChw16c, AVX-512) on small feature maps with many channels: 1.2-1.8x
// slower forward and backward at 4x4 and 2x2 pixels from 256 channels up (bench/conv_layouts.py,
// docs/speed.md). The host finds each convolution's shapes by tracing one forward and restrides
// those convolutions' weights back to NCHW; a model whose convolutions run in their weight's
// layout (Kiln's resnet) then runs them there, and everything else in NHWC.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dist/process_group.hpp"
#include "kiln/torch.hpp"

namespace kiln::engine {

// One convolution a forward called.
struct ConvCall {
  const c10::TensorImpl* weight = nullptr;  // the weight tensor it was given (a parameter's)
  int64_t in_channels = 0, groups = 1;
  int64_t kernel_h = 0, kernel_w = 0;
  int64_t out_h = 0, out_w = 0;
  bool input_channels_last = false;  // the input it was given was NHWC
};

// The 2-D convolutions one forward of `model` on `sample` calls, in call order. The forward runs
// in evaluation mode without gradients (no running statistics move, no random draws); the model's
// mode is put back.
std::vector<ConvCall> trace_convolutions(kiln::Model& model, const at::Tensor& sample);

// Whether oneDNN's blocked NCHW kernels are the faster ones for `call` on an AVX-512 CPU, as
// measured: a kernel larger than 1x1, no groups, at least 256 input channels and at most 16
// output pixels.
bool blocked_nchw_is_faster(const ConvCall& call);

// Whether oneDNN runs its AVX-512 kernels on this CPU (where the rule above was measured; with
// AVX2 alone the two layouts were within 5 % of each other at 4x4).
bool onednn_uses_avx512();

// Restrides to NCHW the 4-D weights of the convolutions blocked_nchw_is_faster picks in one
// forward on `sample`, when `avx512`, and keeps those the model then runs in NCHW (a second
// forward: ATen runs a convolution with an NHWC input in NHWC whatever its weight, so a model
// must move the input itself), with the 1x1 ones whose input then comes NCHW (with
// channels-last's exact strides their weights would have ATen reorder that input); the others
// go back to channels-last. The ranks of `group` (null:
// one process) take rank 0's choice, so that every rank lays out each gradient alike. Returns the
// weights' names; a forward that fails leaves every weight channels-last (the caller logs why).
struct NchwChoice {
  std::vector<std::string> names;
  std::string trace_error;  // non-empty: tracing failed, nothing was restrided on this rank's say
};
NchwChoice keep_small_maps_nchw(kiln::Model& model, const at::Tensor& sample, bool avx512,
                                dist::ProcessGroup* group);

}  // namespace kiln::engine
