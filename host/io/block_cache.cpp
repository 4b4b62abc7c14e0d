#include "io/block_cache.hpp"

#include <c10/core/impl/alloc_cpu.h>

#include <unordered_map>
#include <vector>

namespace kiln::io {
namespace {

// One cache per thread, as glibc's tcache: no lock on the step's hot path. A block freed on
// another thread than the one that allocated it (a loader worker's batch) joins the freeing
// thread's cache.
struct ThreadBlocks {
  // Blocks of up to kDirectBytes by size / kGranule (a direct index: the hot path), larger ones
  // in a map; each list last freed last.
  static constexpr size_t kDirectBytes = size_t{256} << 10;
  std::vector<std::vector<void*>> small =
      std::vector<std::vector<void*>>(kDirectBytes / BlockCache::kGranule + 1);
  std::unordered_map<size_t, std::vector<void*>> large;
  size_t cached_bytes = 0;

  std::vector<void*>& list(size_t block_bytes) {
    return block_bytes <= kDirectBytes ? small[block_bytes / BlockCache::kGranule]
                                       : large[block_bytes];
  }
  void release_all() {
    for (auto& l : small) {
      for (void* b : l) c10::free_cpu(b);
      l.clear();
    }
    for (auto& [size, l] : large) {
      for (void* b : l) c10::free_cpu(b);
      l.clear();
    }
    cached_bytes = 0;
  }
};

// Trivially destructible, so still readable while the thread's other destructors run (a
// thread_local tensor freed after the reaper finds t_exited and bypasses the cache).
thread_local ThreadBlocks* t_blocks = nullptr;
thread_local bool t_exited = false;

// Frees the thread's blocks when the thread ends.
struct Reaper {
  bool armed = false;
  ~Reaper() {
    if (t_blocks != nullptr) {
      t_blocks->release_all();
      delete t_blocks;
      t_blocks = nullptr;
    }
    t_exited = true;
  }
};
thread_local Reaper t_reaper;

// The calling thread's cache, created on first use; nullptr once the thread is ending.
ThreadBlocks* thread_blocks() {
  if (t_blocks == nullptr && !t_exited) {
    t_reaper.armed = true;  // constructs the reaper, which registers its destructor
    t_blocks = new ThreadBlocks();
  }
  return t_blocks;
}

}  // namespace

void* BlockCache::take(size_t block_bytes) {
  if (block_bytes > kMaxBlockBytes) return nullptr;
  ThreadBlocks* blocks = thread_blocks();
  if (blocks == nullptr) return nullptr;
  std::vector<void*>& kept = blocks->list(block_bytes);
  if (kept.empty()) return nullptr;
  // The most recently freed block: the likeliest to be in the CPU's caches.
  void* block = kept.back();
  kept.pop_back();
  blocks->cached_bytes -= block_bytes;
  return block;
}

void BlockCache::give(void* block, size_t block_bytes) {
  if (block == nullptr) return;
  ThreadBlocks* blocks = block_bytes <= kMaxBlockBytes ? thread_blocks() : nullptr;
  if (blocks != nullptr && blocks->cached_bytes + block_bytes <= kMaxCachedBytes) {
    // The vector grows (allocates) only while the set of sizes in use is still growing.
    blocks->list(block_bytes).push_back(block);
    blocks->cached_bytes += block_bytes;
    return;
  }
  c10::free_cpu(block);
}

void BlockCache::release_all() {
  if (t_blocks != nullptr) t_blocks->release_all();
}

size_t BlockCache::cached_bytes() { return t_blocks != nullptr ? t_blocks->cached_bytes : 0; }

}  // namespace kiln::io
