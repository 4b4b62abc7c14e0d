// How a run's norm layers move their running statistics under gradient accumulation
// (norm.running_stats_update), and the window of micro-batches that the trainer is in, which the
// layers read. PyTorch moves them once per micro-batch at the configured momentum m, so k
// micro-batches per optimizer step decay them k times as fast as one batch of k times the size.
// Two other modes keep the per-step rate of accumulation 1:
//  - adjusted momentum: every micro-batch at m' = 1 − (1 − m)^(1/k), so one step decays the old
//    statistics by (1 − m')^k = 1 − m, as one batch would;
//  - pooled window: the window's micro-batches' statistics pooled (the mean and unbiased variance
//    of all their values, as SyncBatchNorm pools ranks) and applied once, at m, when the window
//    ends: exactly the update one batch of the window's samples would make.
// In both the plugin reports its batch statistics and the host applies them (ABI 1.5).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string_view>
#include <vector>

namespace kiln::plugin {

enum class RunningStatsUpdate {
  kMicroBatch,        // "micro_batch": every micro-batch at m, by the plugin (PyTorch's way)
  kAdjustedMomentum,  // "adjusted_momentum": every micro-batch at 1 − (1 − m)^(1/k)
  kPooledWindow,      // "pooled_window": once per step, the window's pooled statistics at m
};

// The mode a norm.running_stats_update value names; throws std::invalid_argument otherwise (the
// schema has already refused other values).
RunningStatsUpdate parse_running_stats_update(std::string_view name);

// 1 − (1 − momentum)^(1/micro_batches): the momentum that, applied once per micro-batch, decays
// the running statistics by (1 − momentum) per window.
double adjusted_momentum(double momentum, int64_t micro_batches);

// A training forward's batch statistics, as a norm plugin reports them.
struct BatchStats {
  double count = 0;  // values per channel behind them, over every rank that shared them
  at::Tensor mean;   // [C] float32
  at::Tensor var;    // [C] float32, unbiased
  double momentum = 0;
};

// The statistics of all values behind `parts` together: N = Σ n_j, mean = Σ n_j·mean_j / N,
// unbiased var = (Σ (n_j − 1)·var_j + Σ n_j·(mean_j − mean)²) / (N − 1) (Chan et al.), in double;
// the momentum of the first part.
BatchStats pool(const std::vector<BatchStats>& parts);

// r ← (1 − momentum)·r + momentum·s for the mean and the (unbiased) variance, as torch.
void update_running_stats(const at::Tensor& running_mean, const at::Tensor& running_var,
                          const BatchStats& stats, double momentum);

// The trainer's window, shared with every norm layer of its model. Outside a window (before the
// first begin, after finish) and in windows of one micro-batch, the layers update as PyTorch
// does: every mode then means the same.
class NormWindow {
 public:
  explicit NormWindow(RunningStatsUpdate mode) : mode_(mode) {}
  RunningStatsUpdate mode() const { return mode_; }

  // The trainer: a step's window of `micro_batches` begins; micro-batch `index` (from 0) runs
  // next; the window ends (the pooled updates are applied).
  void begin(int64_t micro_batches);
  void enter(int64_t index);
  void finish();

  // Whether a training forward now hands its running-statistics update to the host: a mode
  // other than kMicroBatch in an open window of more than one micro-batch.
  bool host_updates() const;

  // One layer's batch statistics for the micro-batch in flight (host_updates() only). Adjusted
  // momentum: applied now. Pooled window: kept, per micro-batch, so that a recomputed forward
  // (activation checkpointing) replaces its first instead of counting twice, and applied by
  // finish(). `layer` identifies the layer; the running statistics are its buffers.
  void record(const void* layer, const at::Tensor& running_mean, const at::Tensor& running_var,
              BatchStats stats);

 private:
  struct Pending {
    at::Tensor running_mean, running_var;
    std::map<int64_t, BatchStats> parts;  // by micro-batch index
  };
  RunningStatsUpdate mode_;
  bool open_ = false;
  int64_t size_ = 1;
  int64_t index_ = 0;
  std::map<const void*, Pending> pending_;  // pooled window: by layer
};

}  // namespace kiln::plugin
