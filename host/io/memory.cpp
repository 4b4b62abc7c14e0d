#include "io/memory.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <sys/resource.h>

namespace kiln::io {

double peak_memory_mib(const c10::Device& device) {
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return static_cast<double>(stats.allocated_bytes[aggregate].peak) / (1024.0 * 1024.0);
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

}  // namespace kiln::io
