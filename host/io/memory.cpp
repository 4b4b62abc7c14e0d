#include "io/memory.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAMacros.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>

#include "io/block_cache.hpp"

namespace kiln::io {
namespace {

// ---- CPU: a counting allocator in front of c10's ---------------------------------------------

// Above c10's default (0), so later default-priority registrations cannot displace the counter.
constexpr uint8_t kCountingPriority = 1;

// Separate cache lines: current is written on every allocation, peak only when it grows.
struct alignas(64) Counter {
  std::atomic<int64_t> value{0};
};
Counter g_current;
Counter g_peak;

void raise_peak(int64_t candidate) {
  int64_t peak = g_peak.value.load(std::memory_order_relaxed);
  while (candidate > peak &&
         !g_peak.value.compare_exchange_weak(peak, candidate, std::memory_order_relaxed)) {
  }
}

// Each block carries its size in a header just before the data, so a bare data pointer finds
// its byte count again: the DataPtr's context is the data pointer itself, as c10 requires of
// raw_allocate/raw_deallocate (oneDNN's CPU convolutions use them) and of copy-on-write clones.
// The header is one alignment unit, so the data keeps c10's 64-byte alignment.
constexpr size_t kHeader = c10::gAlignment;
static_assert(kHeader >= sizeof(int64_t), "the header holds the byte count");

void free_counted(void* data) {
  if (data == nullptr) return;
  char* block = static_cast<char*>(data) - kHeader;
  int64_t bytes = 0;
  std::memcpy(&bytes, block, sizeof bytes);
  g_current.value.fetch_sub(bytes, std::memory_order_relaxed);
  BlockCache::give(block, BlockCache::block_size(static_cast<size_t>(bytes) + kHeader));
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    // Nothing to count: c10 hands out a null pointer for zero bytes.
    if (n == 0) return {nullptr, nullptr, &free_counted, c10::Device(c10::DeviceType::CPU)};
    // Step-sized blocks come back from the cache: the same sizes recur every step.
    const size_t block_bytes = BlockCache::block_size(n + kHeader);
    auto* block = static_cast<char*>(BlockCache::take(block_bytes));
    if (block == nullptr) block = static_cast<char*>(c10::alloc_cpu(block_bytes));
    const auto bytes = static_cast<int64_t>(n);
    std::memcpy(block, &bytes, sizeof bytes);
    raise_peak(g_current.value.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    void* data = block + kHeader;
    return {data, data, &free_counted, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

// Published after SetCPUAllocator (release), so a reader that sees it also sees c10's slot set.
std::atomic<CountingAllocator*> g_counting{nullptr};

// ---- CUDA: c10's caching allocator statistics ------------------------------------------------

constexpr auto kAggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

// Peak allocated bytes per device from windows closed by reset_peak_tensor_memory, so that
// peak_memory_mib still reports the peak of the whole run.
std::array<std::atomic<int64_t>, C10_COMPILE_TIME_MAX_GPUS> g_cuda_run_peak{};

c10::DeviceIndex cuda_index(const c10::Device& device) {
  return device.has_index() ? device.index() : c10::cuda::current_device();
}

// Nothing was allocated before the caching allocator initialises, and its stats would throw.
bool cuda_stats_available() {
  return c10::cuda::device_count() > 0 && c10::cuda::CUDACachingAllocator::get()->initialized();
}

c10::CachingAllocator::Stat cuda_allocated(c10::DeviceIndex index) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(index).allocated_bytes[kAggregate];
}

std::atomic<int64_t>& cuda_run_peak(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < C10_COMPILE_TIME_MAX_GPUS, "CUDA device index ", int{index},
              " out of range");
  return g_cuda_run_peak[static_cast<size_t>(index)];
}

}  // namespace

double peak_memory_mib(const c10::Device& device) {
  if (device.is_cuda()) {
    if (!cuda_stats_available()) return 0.0;
    const c10::DeviceIndex index = cuda_index(device);
    const int64_t peak =
        std::max(cuda_allocated(index).peak, cuda_run_peak(index).load(std::memory_order_relaxed));
    return static_cast<double>(peak) / (1024.0 * 1024.0);
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

void count_cpu_tensor_memory() {
  // A magic static: concurrent first calls wait for one installation.
  static const bool installed = [] {
    auto* counting = new CountingAllocator();  // static lifetime, as c10 requires
    c10::SetCPUAllocator(counting, kCountingPriority);
    g_counting.store(counting, std::memory_order_release);
    return true;
  }();
  (void)installed;
}

bool cpu_tensor_memory_counted() {
  const CountingAllocator* counting = g_counting.load(std::memory_order_acquire);
  return counting != nullptr && c10::GetCPUAllocator() == counting;
}

TensorMemory tensor_memory(const c10::Device& device) {
  if (device.is_cpu()) {
    if (!cpu_tensor_memory_counted()) return {};
    return {g_current.value.load(std::memory_order_relaxed),
            g_peak.value.load(std::memory_order_relaxed)};
  }
  if (device.is_cuda() && cuda_stats_available()) {
    const auto stat = cuda_allocated(cuda_index(device));
    return {stat.current, stat.peak};
  }
  return {};
}

void reset_peak_tensor_memory(const c10::Device& device) {
  if (device.is_cpu()) {
    g_peak.value.store(g_current.value.load(std::memory_order_relaxed), std::memory_order_relaxed);
    // An allocation racing with the store may have raised its peak before it; count it again.
    raise_peak(g_current.value.load(std::memory_order_relaxed));
    return;
  }
  if (device.is_cuda() && cuda_stats_available()) {
    const c10::DeviceIndex index = cuda_index(device);
    auto& run_peak = cuda_run_peak(index);
    const int64_t closing = cuda_allocated(index).peak;
    int64_t seen = run_peak.load(std::memory_order_relaxed);
    while (closing > seen &&
           !run_peak.compare_exchange_weak(seen, closing, std::memory_order_relaxed)) {
    }
    c10::cuda::CUDACachingAllocator::resetPeakStats(index);
  }
}

}  // namespace kiln::io
