// Peak memory of the run so far, for metrics: on CUDA the caching allocator's peak of allocated
// bytes on the device (what torch.cuda.max_memory_allocated reports); on the CPU the process's
// peak resident set (everything the process touched, libraries included).
#pragma once

#include <c10/core/Device.h>

namespace kiln::io {

double peak_memory_mib(const c10::Device& device);

}  // namespace kiln::io
