// io/heap: the heap tuning applies by default and steps aside when the user configured glibc's
// allocator. Then what it buys: a freed 16 MiB block comes back without new page faults.
#include "io/heap.hpp"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>

#include <cstdlib>

namespace {

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

TEST(Heap, UserSettingsWin) {
  setenv("MALLOC_TOP_PAD_", "1", 1);
  EXPECT_FALSE(kiln::io::tune_heap_for_training());
  unsetenv("MALLOC_TOP_PAD_");
}

// One "step": two 16 MiB blocks (2048 x 2048 float32 gradients), every page written, then freed.
// Returns the minor page faults it took. Volatile writes: the stores must not be optimised out.
long step() {
  constexpr size_t kBytes = 16u << 20;
  const long before = minor_faults();
  char* a = static_cast<char*>(std::malloc(kBytes));
  char* b = static_cast<char*>(std::malloc(kBytes));
  for (size_t i = 0; i < kBytes; i += 4096) {
    static_cast<volatile char*>(a)[i] = 1;
    static_cast<volatile char*>(b)[i] = 1;
  }
  const long faults = minor_faults() - before;
  std::free(a);
  std::free(b);
  return faults;
}

TEST(Heap, FreedStepSizedBlocksStayInTheProcess) {
  ASSERT_TRUE(kiln::io::tune_heap_for_training());
  step();  // the first step faults its pages in
  // With glibc's defaults every later step faults all 8192 pages in again; tuned, none.
  EXPECT_LT(step(), 64) << "freed blocks were handed back to the kernel";
  EXPECT_LT(step(), 64) << "freed blocks were handed back to the kernel";
}

}  // namespace
