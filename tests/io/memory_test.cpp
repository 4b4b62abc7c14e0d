// io/memory: the counting CPU allocator counts exactly the bytes tensor storage asks for, frees
// exactly them, keeps a peak until reset, survives threads, and leaves alone what it did not
// allocate (tensors from before installation, from_blob, pinned memory). On CUDA, tensor_memory
// is c10's caching-allocator statistics.
#include "io/memory.hpp"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "io/block_cache.hpp"

namespace {

using kiln::io::tensor_memory;
using kiln::io::TensorMemory;

const c10::Device kCpu(c10::kCPU);
constexpr int64_t kMiB = 1 << 20;

// Allocated during static initialisation, before any test installs the counter.
at::Tensor g_before_install = at::ones({1 << 18}, at::kFloat);

int64_t current() { return tensor_memory(kCpu).current_bytes; }
int64_t peak() { return tensor_memory(kCpu).peak_bytes; }

class CpuTensorMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    kiln::io::count_cpu_tensor_memory();
    ASSERT_TRUE(kiln::io::cpu_tensor_memory_counted());
  }
};

TEST(CpuTensorMemoryInstall, NotCountedBeforeInstallation) {
  if (kiln::io::cpu_tensor_memory_counted()) GTEST_SKIP() << "installed by an earlier test";
  const TensorMemory none = tensor_memory(kCpu);
  EXPECT_EQ(none.current_bytes, 0);
  EXPECT_EQ(none.peak_bytes, 0);
}

TEST_F(CpuTensorMemory, EmptyCountsRequestedBytesAndFreesThem) {
  const int64_t before = current();
  {
    const at::Tensor t = at::empty({1 << 20}, at::kFloat);
    EXPECT_EQ(current() - before, 4 * kMiB);
    EXPECT_GE(peak(), before + 4 * kMiB);
    // c10's alignment is kept (CPU storage is aligned to 64 bytes).
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
    // Odd sizes count what was asked for, not what malloc rounded up to.
    const at::Tensor odd = at::empty({3}, at::kByte);
    EXPECT_EQ(current() - before, 4 * kMiB + 3);
  }
  EXPECT_EQ(current(), before);
}

TEST_F(CpuTensorMemory, PeakStaysUntilReset) {
  kiln::io::reset_peak_tensor_memory(kCpu);
  const int64_t before = current();
  EXPECT_EQ(peak(), before);
  { const at::Tensor t = at::empty({1 << 20}, at::kFloat); }
  EXPECT_EQ(current(), before);
  EXPECT_EQ(peak(), before + 4 * kMiB);
  const at::Tensor kept = at::empty({1 << 18}, at::kFloat);
  EXPECT_EQ(peak(), before + 4 * kMiB);
  kiln::io::reset_peak_tensor_memory(kCpu);
  EXPECT_EQ(peak(), current());
  EXPECT_EQ(peak(), before + kMiB);
}

TEST_F(CpuTensorMemory, DoubleInstallIsANoOp) {
  c10::Allocator* installed = c10::GetCPUAllocator();
  kiln::io::count_cpu_tensor_memory();
  kiln::io::count_cpu_tensor_memory();
  EXPECT_EQ(c10::GetCPUAllocator(), installed);
  const int64_t before = current();
  const at::Tensor t = at::empty({1 << 18}, at::kFloat);
  EXPECT_EQ(current() - before, kMiB);  // counted once, not once per install
}

TEST_F(CpuTensorMemory, TensorsFromBeforeInstallationFreeUncounted) {
  if (!g_before_install.defined()) GTEST_SKIP() << "freed by an earlier repetition";
  // Its storage remembers the allocator that made it, not the counting one.
  EXPECT_NE(g_before_install.storage().allocator(), c10::GetCPUAllocator());
  const int64_t before = current();
  g_before_install.add_(1.0);
  g_before_install.reset();
  EXPECT_EQ(current(), before);
  EXPECT_GE(current(), 0);
}

TEST_F(CpuTensorMemory, ZeroBytesAndFromBlobAreNotCounted) {
  const int64_t before = current();
  const at::Tensor none = at::empty({0}, at::kFloat);
  EXPECT_EQ(current(), before);

  std::vector<float> buffer(1 << 16, 1.0f);
  bool deleted = false;
  {
    const at::Tensor view = at::from_blob(
        buffer.data(), {static_cast<int64_t>(buffer.size())}, [&](void*) { deleted = true; },
        at::kFloat);
    EXPECT_EQ(view.data_ptr(), buffer.data());
    EXPECT_EQ(current(), before);
    // A result computed from it is ordinary storage and is counted.
    const at::Tensor doubled = view * 2;
    EXPECT_EQ(current() - before, static_cast<int64_t>(buffer.size() * sizeof(float)));
  }
  EXPECT_TRUE(deleted);
  EXPECT_EQ(current(), before);
}

// The data loader's batch collation grows a tensor with resize_: old storage out, new in.
TEST_F(CpuTensorMemory, ResizeTracksTheStorage) {
  const int64_t before = current();
  {
    at::Tensor batch = at::empty({0}, at::kFloat);
    batch.resize_({1 << 18});
    EXPECT_EQ(current() - before, kMiB);
    batch.resize_({1 << 19});
    EXPECT_EQ(current() - before, 2 * kMiB);
    batch.resize_({16});  // shrinking keeps the storage
    EXPECT_EQ(current() - before, 2 * kMiB);
    const at::Tensor stacked = at::stack({batch, batch});
    EXPECT_EQ(current() - before, 2 * kMiB + 2 * 16 * 4);
  }
  EXPECT_EQ(current(), before);
}

// Allocator::clone goes through allocate + copy_data.
TEST_F(CpuTensorMemory, CloneCopiesAndCountsTheCopy) {
  const int64_t before = current();
  const at::Tensor source = at::arange(1000, at::kFloat);
  c10::DataPtr copy = c10::GetCPUAllocator()->clone(source.data_ptr(), source.nbytes());
  EXPECT_EQ(current() - before, 2 * 4000);
  EXPECT_EQ(static_cast<const float*>(copy.get())[999], 999.0f);
  copy.clear();
  EXPECT_EQ(current() - before, 4000);
}

// c10's raw_allocate/raw_deallocate (oneDNN's CPU convolutions use them) and copy-on-write lazy
// clones need the data pointer to be its own context: both work and are counted.
TEST_F(CpuTensorMemory, RawAllocateAndLazyCloneWork) {
  const int64_t before = current();
  c10::Allocator* cpu = c10::GetCPUAllocator();
  ASSERT_NE(cpu->raw_deleter(), nullptr);
  void* raw = cpu->raw_allocate(64);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(raw) % 64, 0u);
  EXPECT_EQ(current() - before, 64);
  cpu->raw_deallocate(raw);
  EXPECT_EQ(current(), before);
  const at::Tensor t = at::ones({8}, at::kFloat);
  at::Tensor lazy = at::_lazy_clone(t);
  lazy.add_(1);  // materialises the copy
  EXPECT_EQ(lazy[0].item<float>(), 2.0f);
  EXPECT_EQ(t[0].item<float>(), 1.0f);
  EXPECT_EQ(current() - before, 64);
}

TEST_F(CpuTensorMemory, BackwardRaisesThePeakAndLeavesParametersAndGradients) {
  const int64_t base = current();
  const at::Tensor x = at::randn({256, 128});
  const at::Tensor y = at::randn({256, 10});
  std::vector<at::Tensor> params = {at::randn({512, 128}).mul_(0.05), at::zeros({512}),
                                    at::randn({10, 512}).mul_(0.05), at::zeros({10})};
  for (auto& p : params) p.set_requires_grad(true);
  const int64_t resting = current();
  kiln::io::reset_peak_tensor_memory(kCpu);
  {
    const at::Tensor hidden = at::relu(at::linear(x, params[0], params[1]));
    const at::Tensor loss = at::mse_loss(at::linear(hidden, params[2], params[3]), y);
    loss.backward();
  }
  int64_t expected = x.storage().nbytes() + y.storage().nbytes();
  for (const auto& p : params) {
    ASSERT_TRUE(p.grad().defined());
    expected += p.storage().nbytes() + p.grad().storage().nbytes();
  }
  EXPECT_EQ(current() - base, expected);
  // The hidden activations (256 x 512 floats, twice: pre- and post-ReLU) lived in the window.
  EXPECT_GE(peak() - resting, 2 * 256 * 512 * 4);
  EXPECT_GT(peak(), current());
}

TEST_F(CpuTensorMemory, ConcurrentAllocationBalances) {
  const int64_t before = current();
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &failed] {
      kiln::io::count_cpu_tensor_memory();  // racing installs must stay a no-op
      std::vector<at::Tensor> held;
      for (int i = 0; i < 2000; ++i) {
        held.push_back(at::empty({1 + (i * 37 + t) % 4096}, at::kFloat));
        if (held.size() > 8) held.erase(held.begin());
        if (current() < 0) failed = true;
      }
    });
  }
  // Intra-op worker threads too.
  at::parallel_for(0, 256, 1, [](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const at::Tensor scratch = at::empty({1024 + i}, at::kFloat);
    }
  });
  for (auto& thread : threads) thread.join();
  EXPECT_FALSE(failed);
  EXPECT_EQ(current(), before);
  EXPECT_GE(peak(), before);
}

TEST_F(CpuTensorMemory, OtherDevicesReportZero) {
  const TensorMemory meta = tensor_memory(c10::Device(c10::kMeta));
  EXPECT_EQ(meta.current_bytes, 0);
  EXPECT_EQ(meta.peak_bytes, 0);
  const int64_t before = current();
  const at::Tensor shape_only = at::empty({1 << 20}, at::TensorOptions().device(c10::kMeta));
  EXPECT_EQ(current(), before);
}

bool have_cuda() { return c10::cuda::device_count() > 0; }

TEST_F(CpuTensorMemory, PinnedMemoryIsNotCounted) {
  if (!have_cuda()) GTEST_SKIP() << "pinned memory needs a CUDA device";
  const int64_t before = current();
  const at::Tensor pinned = at::empty({1 << 20}, at::TensorOptions().pinned_memory(true));
  EXPECT_TRUE(pinned.is_pinned());
  EXPECT_EQ(current(), before);
}

// ---- freed blocks kept for reuse (io/block_cache.hpp) ----------------------------------------

using kiln::io::BlockCache;

TEST_F(CpuTensorMemory, AFreedStepSizedBlockIsReusedAndNoLongerCounted) {
  BlockCache::release_all();
  const int64_t before = current();
  void* first = nullptr;
  {
    const at::Tensor t = at::empty({1000}, at::kFloat);
    first = t.data_ptr();
  }
  // Kept, not freed, and not counted as tensor memory.
  EXPECT_EQ(current(), before);
  EXPECT_EQ(BlockCache::cached_bytes(), BlockCache::block_size(4000 + 64));
  // A request that rounds to the same block size gets the same block back, aligned as c10's.
  const at::Tensor again = at::empty({998}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(again.data_ptr()) % 64, 0u);
  EXPECT_EQ(current() - before, 998 * 4);
  EXPECT_EQ(BlockCache::cached_bytes(), 0u);
  // Another size does not take it.
  const at::Tensor other = at::empty({2000}, at::kFloat);
  EXPECT_NE(other.data_ptr(), first);
}

TEST_F(CpuTensorMemory, BlocksAboveTheSizeLimitGoBackToTheHeap) {
  BlockCache::release_all();
  {
    const at::Tensor big = at::empty({static_cast<int64_t>(BlockCache::kMaxBlockBytes)}, at::kByte);
  }
  EXPECT_EQ(BlockCache::cached_bytes(), 0u);
}

TEST_F(CpuTensorMemory, WhatIsKeptIsBounded) {
  BlockCache::release_all();
  // Blocks just under the size limit, more of them than the bound holds.
  const int64_t n = static_cast<int64_t>(BlockCache::kMaxBlockBytes) - 4096;
  const size_t block = BlockCache::block_size(static_cast<size_t>(n) + 64);
  const size_t fit = BlockCache::kMaxCachedBytes / block;
  {
    std::vector<at::Tensor> many;
    for (size_t i = 0; i < fit + 8; ++i) many.push_back(at::empty({n}, at::kByte));
  }
  EXPECT_EQ(BlockCache::cached_bytes(), fit * block);
  EXPECT_LE(BlockCache::cached_bytes(), BlockCache::kMaxCachedBytes);
  // Taken back one by one: every kept block is distinct and usable.
  std::set<void*> seen;
  std::vector<at::Tensor> again;
  for (size_t i = 0; i < fit; ++i) {
    again.push_back(at::ones({n}, at::kByte));
    EXPECT_TRUE(seen.insert(again.back().data_ptr()).second);
  }
  EXPECT_EQ(BlockCache::cached_bytes(), 0u);
  BlockCache::release_all();
}

TEST_F(CpuTensorMemory, EachThreadKeepsItsOwnBlocksAndFreesThemWhenItEnds) {
  BlockCache::release_all();
  const int64_t before = current();
  size_t kept_on_thread = 0;
  std::thread worker([&] {
    { const at::Tensor t = at::ones({4096}, at::kFloat); }
    kept_on_thread = BlockCache::cached_bytes();
  });
  worker.join();
  EXPECT_EQ(kept_on_thread, BlockCache::block_size(4 * 4096 + 64));
  // Nothing moved to this thread's cache; the counter balances.
  EXPECT_EQ(BlockCache::cached_bytes(), 0u);
  EXPECT_EQ(current(), before);
  // A tensor made here and freed on another thread joins that thread's cache.
  at::Tensor handed = at::ones({512}, at::kFloat);
  std::thread consumer([t = std::move(handed)]() mutable { t.reset(); });
  consumer.join();
  EXPECT_EQ(BlockCache::cached_bytes(), 0u);
  EXPECT_EQ(current(), before);
}

TEST(CudaTensorMemory, AgreesWithCachingAllocatorStats) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  auto stats = [] {
    const auto all = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    return all.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  };
  at::Tensor t = at::empty({1 << 24}, at::TensorOptions().device(cuda));  // 64 MiB
  TensorMemory memory = tensor_memory(cuda);
  EXPECT_EQ(memory.current_bytes, stats().current);
  EXPECT_EQ(memory.peak_bytes, stats().peak);
  EXPECT_GE(memory.current_bytes, 64 * kMiB);
  // "cuda" without an index means the current device.
  EXPECT_EQ(tensor_memory(c10::Device(c10::kCUDA)).current_bytes, memory.current_bytes);

  const int64_t with_tensor = memory.current_bytes;
  t.reset();
  memory = tensor_memory(cuda);
  EXPECT_EQ(memory.current_bytes, with_tensor - 64 * kMiB);
  EXPECT_GE(memory.peak_bytes, with_tensor);
  kiln::io::reset_peak_tensor_memory(cuda);
  memory = tensor_memory(cuda);
  EXPECT_EQ(memory.peak_bytes, memory.current_bytes);
  EXPECT_EQ(memory.peak_bytes, stats().peak);
  // The run's peak survives the per-window reset.
  EXPECT_GE(kiln::io::peak_memory_mib(cuda), 64.0);
}

}  // namespace
