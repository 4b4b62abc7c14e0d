#include "io/heap.hpp"

#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace kiln::io {

bool tune_heap_for_training() {
#if defined(__GLIBC__)
  for (const char* name :
       {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(name) != nullptr) return false;
  }
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024) == 1;
  return mmap_ok && trim_ok;
#else
  return false;
#endif
}

}  // namespace kiln::io
