// A bounded cache of freed CPU tensor blocks, by size, for the counting allocator (memory.hpp).
//
// Why: a training step frees and re-allocates the same storage sizes every step. Through glibc
// each of those is a malloc and a free, and every free of a block of 64 KiB or more makes glibc
// consolidate its fast bins (malloc_consolidate), which on a dispatch-bound model cost more than
// the allocations themselves. Blocks up to kMaxBlockBytes are kept here instead, up to
// kMaxCachedBytes per thread; larger blocks, and blocks past the bound, go back to c10's free_cpu.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::io {

// The calling thread's cache (each thread keeps its own, as glibc's tcache, so the hot path
// takes no lock; kMaxCachedBytes bounds each). Blocks are c10::alloc_cpu blocks.
struct BlockCache {
  static constexpr size_t kMaxBlockBytes = size_t{1} << 20;    // larger blocks are not kept
  static constexpr size_t kMaxCachedBytes = size_t{32} << 20;  // bound per thread
  static constexpr size_t kGranule = 64;                       // block sizes are multiples

  // The size of the block for a request of `bytes` (rounded up to kGranule).
  static size_t block_size(size_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }

  // A kept block of exactly `block_bytes` (a block_size() value), or nullptr when none is kept.
  static void* take(size_t block_bytes);
  // Keeps `block` (from c10::alloc_cpu(block_bytes)) for reuse, or frees it with c10::free_cpu
  // when it is too large or the thread's cache is full. Takes ownership.
  static void give(void* block, size_t block_bytes);
  // Frees every block the calling thread keeps.
  static void release_all();
  // Bytes the calling thread keeps, for tests and diagnostics.
  static size_t cached_bytes();
};

}  // namespace kiln::io
