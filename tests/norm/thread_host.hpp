// A fake kiln_host_api whose collectives run between threads of the test process: N threads
// are N ranks of one ThreadGroup, each passing its own kiln_call_context. The collectives meet
// at a barrier, exchange through CPU copies and count how often each rank called them.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "host_base.hpp"
#include "kiln/sdk.hpp"

namespace kiln::norm_test {
class ThreadGroup;
}

// The test's definition of the host's per-call context: which rank of which group calls.
struct kiln_call_context {
  kiln::norm_test::ThreadGroup* group = nullptr;  // nullptr: a single process
  int32_t rank = 0;
};

namespace kiln::norm_test {

class ThreadGroup {
 public:
  explicit ThreadGroup(int32_t world);
  int32_t world() const { return world_; }

  // Called by every rank with its own tensors; block until all ranks joined (throw after a
  // timeout, so a rank that refused instead of joining fails the test instead of hanging it).
  void allgather(int32_t rank, const at::Tensor& in, const at::Tensor& out);
  void allreduce(int32_t rank, const at::Tensor& inout, int32_t op);
  void broadcast(int32_t rank, const at::Tensor& inout, int32_t root);

  // How often `rank` called each collective since the last reset_counts().
  int allgathers(int32_t rank) const;
  int allreduces(int32_t rank) const;
  void reset_counts();

 private:
  void barrier();
  void publish(int32_t rank, const at::Tensor& t);

  int32_t world_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int32_t arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<at::Tensor> slots_;  // each rank's contribution (CPU, flat)
  std::vector<int> allgathers_, allreduces_;
};

// The services table: status, log, rank/world_size and the collectives of ThreadGroup.
const kiln_host_api* thread_host();

// Runs fn(rank, ctx) on one thread per rank of `group`; rethrows the first exception.
void run_ranks(ThreadGroup& group, const std::function<void(int32_t, kiln_call_context*)>& fn);

}  // namespace kiln::norm_test
