// Memory of the run, measured by Kiln itself.
//
// peak_memory_mib: peak of the run so far, for metrics: on CUDA the caching allocator's peak of
// allocated bytes on the device (what torch.cuda.max_memory_allocated reports); on the CPU the
// process's peak resident set (everything the process touched, libraries included).
//
// tensor_memory: live and peak bytes of tensor storage only. CUDA has these from c10's caching
// allocator; the CPU has no such statistics, so count_cpu_tensor_memory() puts a counting
// allocator in front of c10's CPU allocator.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace kiln::io {

double peak_memory_mib(const c10::Device& device);

struct TensorMemory {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
};

// Installs a counting CPU allocator as c10's (c10::SetCPUAllocator at a priority above the
// default): c10's aligned alloc_cpu/free_cpu, with freed blocks of up to 1 MiB kept for reuse
// (io/block_cache.hpp), and the byte count in a 64-byte header before the data, so the data
// pointer is its own context (raw_allocate, which oneDNN uses, and copy-on-write clones need
// that). Idempotent and thread-safe; call once at start-up, before
// the tensors that matter are allocated. Tensors allocated before keep their own deleter and
// are simply not counted. Counts bytes requested (nbytes) by tensor storage; at::from_blob and
// pinned memory do not go through it.
void count_cpu_tensor_memory();

// Whether c10's CPU allocator is the counting one (false before installation, or when another
// allocator of higher priority holds the slot).
bool cpu_tensor_memory_counted();

// Live and peak bytes of tensor storage on `device`: on the CPU from the counting allocator
// (zeros when it is not installed), on CUDA from the caching allocator's device statistics
// (allocated_bytes, aggregate: torch.cuda.memory_allocated / max_memory_allocated). Other
// devices: zeros.
TensorMemory tensor_memory(const c10::Device& device);

// Starts a new peak window: peak := current (the CPU counter; CUDA resetPeakStats).
void reset_peak_tensor_memory(const c10::Device& device);

}  // namespace kiln::io
