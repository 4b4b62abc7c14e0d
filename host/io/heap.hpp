// The C heap tuned for a training process: glibc's defaults hand the gradient- and
// activation-sized blocks a step frees back to the kernel and fault them in again on the next
// step (zeroed pages, every step); keeping them costs nothing a training run would not hold at
// its peak anyway.
#pragma once

namespace kiln::io {

// Serves blocks up to 32 MiB (glibc's ceiling for this setting) from the heap instead of fresh
// mappings, and keeps up to 1 GiB of freed heap top instead of trimming it. Does nothing when
// the user set any MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ / MALLOC_TOP_PAD_ or
// GLIBC_TUNABLES (their choice wins), or with another libc. Returns whether it applied. The
// Trainer calls it once its set-up is built, before the first step, when it may change the
// process (engine::ProcessSettings::tune_heap: `kiln run`, a C API session that asks).
bool tune_heap_for_training();

}  // namespace kiln::io
