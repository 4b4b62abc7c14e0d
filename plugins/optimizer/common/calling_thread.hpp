// Where a fused CPU optimizer kernel runs: small tensors on the calling thread alone.
//
// ATen's fused CPU optimizer kernels (_fused_sgd_, _fused_adam_, _fused_adamw_) split every
// tensor across the intra-op OpenMP team whatever its size (their parallel_for has grain 0), so a
// tensor of a few thousand elements pays the team's start and join for a microsecond of work: the
// tiny benchmark model's 34 tensors took 84 µs a step on 2 threads and 30 µs on one (torch 2.11,
// 2-core VM). Below ATen's own grain size for element-wise loops (at::internal::GRAIN_SIZE) a
// tensor is therefore stepped with the team shrunk to the calling thread; larger ones keep it.
#ifndef KILN_PLUGINS_OPTIMIZER_COMMON_CALLING_THREAD_HPP_
#define KILN_PLUGINS_OPTIMIZER_COMMON_CALLING_THREAD_HPP_

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

// The OpenMP runtime torch loads (weak: null in a build of torch without OpenMP, and then
// parallel_for never starts a team anyway).
extern "C" int omp_get_max_threads(void) __attribute__((weak));
extern "C" void omp_set_num_threads(int) __attribute__((weak));

namespace kiln::optim {

// Whether a fused kernel should step `t` on the calling thread alone.
inline bool steps_on_calling_thread(const at::Tensor& t) {
  return t.device().is_cpu() && t.numel() < at::internal::GRAIN_SIZE;
}

// While alive (and `on`), this thread's OpenMP team is the thread itself, so ATen's parallel_for
// runs inline. Only this thread's setting changes (OpenMP keeps it per thread); the old one is
// restored on destruction.
class CallingThreadOnly {
 public:
  explicit CallingThreadOnly(bool on) {
    if (!on || omp_get_max_threads == nullptr || omp_set_num_threads == nullptr) return;
    // Torch sets a thread's team size the first time the thread asks for its thread count:
    // ask first, so that torch does not undo the setting below inside the kernel.
    (void)at::get_num_threads();
    const int threads = omp_get_max_threads();
    if (threads <= 1) return;
    restore_ = threads;
    omp_set_num_threads(1);
  }
  ~CallingThreadOnly() {
    if (restore_ > 0) omp_set_num_threads(restore_);
  }
  CallingThreadOnly(const CallingThreadOnly&) = delete;
  CallingThreadOnly& operator=(const CallingThreadOnly&) = delete;

 private:
  int restore_ = 0;  // the team size to put back; 0: nothing changed
};

}  // namespace kiln::optim

#endif  // KILN_PLUGINS_OPTIMIZER_COMMON_CALLING_THREAD_HPP_
