// The ranks a synchronised norm layer shares statistics with: all ranks of the call's process
// group, or consecutive groups of `group_size` ranks (apex's create_syncbn_process_group). The
// host's collectives span the whole process group, so subgroups exchange through one allgather
// over every rank and keep only their own rows.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kiln/torch.hpp"
#include "stats.hpp"

namespace kiln::norm {

class StatsGroup {
 public:
  // Throws when `group_size` does not divide the world size. Every rank fails alike (same
  // configuration, same world), before any collective, so none is left waiting.
  StatsGroup(const kiln_host_api* host, kiln_call_context* ctx, int64_t group_size,
             const char* plugin);

  int32_t world() const { return world_; }
  int32_t size() const { return size_; }  // ranks in this rank's group
  bool alone() const { return size_ == 1; }

  // Every group member's `packed` (float32 [L]) as rows [size, L], in rank order.
  at::Tensor gather(const at::Tensor& packed) const;
  // The sum over the group of `packed` (float32 [L]).
  at::Tensor sum(const at::Tensor& packed) const;

 private:
  const kiln_host_api* host_;
  kiln_call_context* ctx_;
  const char* plugin_;
  int32_t world_ = 1;
  int32_t rank_ = 0;
  int32_t size_ = 1;
  int32_t first_ = 0;  // first rank of this rank's group
};

// The moments of `x` over the group: local ones, then ONE allgather of [n, mean, M2] and Chan's
// combination when the group has other ranks.
Moments group_moments(const StatsGroup& group, const at::Tensor& x);

// Backward's per-channel sums over the group, with the group's sample count: packs
// [n, a(C), b(C)], sums it over the group (one collective) and returns {N, a, b}.
struct GradSums {
  double count;
  at::Tensor a;
  at::Tensor b;
};
GradSums group_grad_sums(const StatsGroup& group, double local_count, const at::Tensor& a,
                         const at::Tensor& b);

}  // namespace kiln::norm
