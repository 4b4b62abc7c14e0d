#include "engine/memory_format.hpp"

#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>

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

int64_t to_channels_last(torch::nn::Module& model) {
  at::NoGradGuard no_grad;
  int64_t restrided = 0;
  auto restride = [&](at::Tensor t) {
    if (t.dim() != 4 || t.is_contiguous(at::MemoryFormat::ChannelsLast)) return;
    // set_data swaps the storage under the same tensor object (a parameter stays the same leaf).
    t.set_data(t.contiguous(at::MemoryFormat::ChannelsLast));
    ++restrided;
  };
  for (const at::Tensor& p : model.parameters()) restride(p);
  for (const at::Tensor& b : model.buffers()) restride(b);
  return restrided;
}

at::Tensor in_model_layout(const at::Tensor& x, bool channels_last) {
  if (!channels_last || x.dim() != 4) return x;
  return x.contiguous(at::MemoryFormat::ChannelsLast);
}

}  // namespace kiln::engine
