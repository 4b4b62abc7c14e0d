#include "engine/step_report.hpp"

#include <ATen/ops/tensor.h>

#include <cmath>
#include <csignal>
#include <vector>

#include "dist/data_parallel.hpp"
#include "dist/process_group.hpp"
#include "io/memory.hpp"

namespace kiln::engine {

RankVote agree(dist::ProcessGroup* group, const RankVote& mine) {
  if (group == nullptr) return mine;
  at::Tensor sums =
      at::tensor(std::vector<double>{mine.loss_sum, mine.samples, mine.signal == SIGINT ? 1.0 : 0.0,
                                     mine.signal == SIGTERM ? 1.0 : 0.0, mine.cancel ? 1.0 : 0.0});
  group->allreduce(sums, "sum");
  RankVote all;
  all.loss_sum = sums[0].item<double>();
  all.samples = sums[1].item<double>();
  all.signal = sums[3].item<double>() > 0   ? SIGTERM
               : sums[2].item<double>() > 0 ? SIGINT
                                            : mine.signal;
  all.cancel = sums[4].item<double>() > 0;
  return all;
}

StepMeter::StepMeter(c10::Device device, const dist::DataParallel* ddp)
    : device_(device), ddp_(ddp) {
  io::reset_peak_tensor_memory(device_);
  resting_bytes_ = io::tensor_memory(device_).current_bytes;
  allreduces_before_ = ddp_ ? ddp_->allreduce_calls() : 0;
}

namespace {
double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }
}  // namespace

void StepMeter::fill(io::StepRecord& r, bool read_process_peak) const {
  r.memory_mb =
      device_.is_cpu() && !read_process_peak ? std::nan("") : io::peak_memory_mib(device_);
  const io::TensorMemory tensors = io::tensor_memory(device_);
  // The CPU's tensors are counted only by Kiln's allocator (ProcessSettings::count_cpu_memory):
  // without it they are unknown (NaN, null in the metrics file), not zero.
  const bool counted = !device_.is_cpu() || io::cpu_tensor_memory_counted();
  r.tensor_mb = counted ? mib(tensors.current_bytes) : NAN;
  r.tensor_peak_mb = counted ? mib(tensors.peak_bytes) : NAN;
  r.activation_mb = counted ? mib(tensors.peak_bytes - resting_bytes_) : NAN;
  r.allreduces = ddp_ ? ddp_->allreduce_calls() - allreduces_before_ : 0;
}

}  // namespace kiln::engine
