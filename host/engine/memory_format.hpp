// The layout of the model's 4-D tensors and of its input images: NCHW (contiguous) or NHWC
// (channels_last), which cuDNN's tensor-core convolutions want under float16/bfloat16 and
// oneDNN's convolutions on the CPU.
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <string>

#include "engine/precision.hpp"

namespace kiln::engine {

// model.memory_format resolved: "channels_last" and "contiguous" as said; "auto" gives
// channels_last to a model with 4-D (convolution) weights on the CPU (oneDNN) and on CUDA under
// a half precision (autocast or a half model), and contiguous elsewhere (CUDA in float32).
bool use_channels_last(const std::string& setting, at::Device device, const PrecisionPlan& plan,
                       torch::nn::Module& model);

// Restrides every 4-D parameter and buffer of `model` to channels_last in place (the tensors
// keep their identity, so optimizer groups and hooks still hold them). Returns how many it
// restrided. A 1x1 kernel's weight gets channels-last's exact strides even though its
// contiguous ones already read as channels-last: ATen's NHWC convolution returns its gradient
// with the exact ones, and DDP's Reducer compares a gradient's strides with its parameter's
// exactly (a warning, and a copy into the bucket each step, otherwise).
int64_t to_channels_last(torch::nn::Module& model);

// Gives `t` the exact strides of `format` (a fresh copy under the same tensor object) unless it
// has them; 4-D tensors only. Returns whether it restrided.
bool restride(const at::Tensor& t, at::MemoryFormat format);

// One 4-D tensor channels-last as to_channels_last lays each out. Returns whether it restrided.
bool restride_channels_last(const at::Tensor& t);

// The model's input in the model's layout: 4-D batches restrided to channels_last when
// `channels_last`, anything else as it is.
at::Tensor in_model_layout(const at::Tensor& x, bool channels_last);

}  // namespace kiln::engine
