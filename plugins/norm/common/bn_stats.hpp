// The statistics a batch-norm style layer applies: batch statistics in training (shared over a
// StatsGroup when synchronised, with the running-statistics update), running statistics in
// evaluation, and the backward's reduced sums. Used by syncbn and inplace_abn(_sync).
#pragma once

#include <ATen/core/Tensor.h>

#include "group.hpp"
#include "kiln/torch.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace kiln::norm {

// Like torch.nn.BatchNorm: without running statistics, batch statistics are used in eval too.
bool uses_batch_stats(const BnOptions& o, int32_t training, const DLTensor* running_mean,
                      const DLTensor* running_var);

// Mean and inverse standard deviation applied by one forward (float64 [C]; callers round the
// per-channel scale and shift they derive to float32).
struct Applied {
  at::Tensor mean;
  at::Tensor invstd;
};

// Computes the statistics of one forward over `x` and updates the running statistics when
// training (or reports the batch statistics, when the host asks for them: report.hpp). `sync`:
// training statistics are shared over the StatsGroup of `ctx` (collectives only in training, as
// torch.nn.SyncBatchNorm; eval never communicates).
Applied forward_stats(const kiln_host_api* host, kiln_call_context* ctx, const BnOptions& o,
                      const kiln_norm_forward_args* args, const at::Tensor& x, bool sync,
                      const char* plugin);

// Writes the applied statistics to save_mean / save_invstd when the host passed them.
void save_stats(const kiln_norm_forward_args* args, const Applied& applied);

// Backward's two per-channel sums over the samples that shared the statistics, and their count.
// Training with `sync`: one collective over the StatsGroup; otherwise this rank's.
GradSums backward_sums(const kiln_host_api* host, kiln_call_context* ctx, const BnOptions& o,
                       int32_t training, bool sync, double local_count, const at::Tensor& a,
                       const at::Tensor& b, const char* plugin);

}  // namespace kiln::norm
