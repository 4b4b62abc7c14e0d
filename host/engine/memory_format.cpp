#include "engine/memory_format.hpp"

#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/core/MemoryFormat.h>
#include <c10/util/strides.h>

namespace kiln::engine {
namespace {

bool has_4d_parameter(torch::nn::Module& model) {
  for (const at::Tensor& p : model.parameters()) {
    if (p.dim() == 4) return true;
  }
  return false;
}

}  // namespace

bool use_channels_last(const std::string& setting, at::Device device, const PrecisionPlan& plan,
                       torch::nn::Module& model) {
  if (setting == "channels_last") return true;
  if (setting == "contiguous") return false;
  if (!has_4d_parameter(model)) return false;
  // CUDA: cuDNN's tensor-core convolutions take NHWC under half precision; in float32 NCHW.
  if (device.is_cuda()) return plan.autocast || plan.half_model();
  // CPU: oneDNN's convolutions run NHWC without reordering, and the fused norm kernels take it
  // (torch.compile's inductor picks the same layout for convolutions on the CPU).
  return device.is_cpu() && at::hasMKLDNN();
}

bool restride(const at::Tensor& t, at::MemoryFormat format) {
  const bool exact =
      format == at::MemoryFormat::ChannelsLast
          ? t.strides() == at::IntArrayRef(c10::get_channels_last_strides_2d(t.sizes()))
          : t.strides() == at::IntArrayRef(c10::contiguous_strides(t.sizes()));
  if (exact) return false;
  at::NoGradGuard no_grad;
  // set_data swaps the storage under the same tensor object (a parameter stays the same leaf).
  // at::empty with a memory format gives that format's exact strides.
  at::Tensor copy = at::empty(t.sizes(), t.options().memory_format(format));
  copy.copy_(t);
  at::Tensor(t).set_data(copy);
  return true;
}

bool restride_channels_last(const at::Tensor& t) {
  // Other tensors that already read as channels-last keep their strides: a single-channel
  // stem's weight, say, whose convolution ATen runs in the input's layout either way.
  const bool one_by_one = t.size(2) == 1 && t.size(3) == 1;
  if (!one_by_one && t.is_contiguous(at::MemoryFormat::ChannelsLast)) return false;
  return restride(t, at::MemoryFormat::ChannelsLast);
}

int64_t to_channels_last(torch::nn::Module& model) {
  int64_t restrided = 0;
  for (const at::Tensor& p : model.parameters()) {
    if (p.dim() == 4 && restride_channels_last(p)) ++restrided;
  }
  for (const at::Tensor& b : model.buffers()) {
    if (b.dim() == 4 && restride_channels_last(b)) ++restrided;
  }
  return restrided;
}

at::Tensor in_model_layout(const at::Tensor& x, bool channels_last) {
  if (!channels_last || x.dim() != 4) return x;
  return x.contiguous(at::MemoryFormat::ChannelsLast);
}

}  // namespace kiln::engine
