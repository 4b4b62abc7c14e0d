#include "plugin/norm_window.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace kiln::plugin {

RunningStatsUpdate parse_running_stats_update(std::string_view name) {
  if (name == "micro_batch") return RunningStatsUpdate::kMicroBatch;
  if (name == "adjusted_momentum") return RunningStatsUpdate::kAdjustedMomentum;
  if (name == "pooled_window") return RunningStatsUpdate::kPooledWindow;
  throw std::invalid_argument("norm.running_stats_update: unknown mode '" + std::string(name) +
                              "'");
}

double adjusted_momentum(double momentum, int64_t micro_batches) {
  if (micro_batches <= 1) return momentum;
  // -expm1(log1p(-m) / k) is 1 − (1 − m)^(1/k) without cancellation for small m; m = 1 keeps 1.
  if (momentum >= 1.0) return 1.0;
  return -std::expm1(std::log1p(-momentum) / static_cast<double>(micro_batches));
}

BatchStats pool(const std::vector<BatchStats>& parts) {
  if (parts.empty()) throw std::logic_error("pool: no statistics to pool");
  if (parts.size() == 1) return parts.front();
  double total = 0;
  for (const BatchStats& p : parts) total += p.count;
  at::Tensor mean = at::zeros_like(parts.front().mean, at::kDouble);
  for (const BatchStats& p : parts) mean.add_(p.mean.to(at::kDouble), p.count / total);
  at::Tensor m2 = at::zeros_like(mean);
  for (const BatchStats& p : parts) {
    at::Tensor mean_j = p.mean.to(at::kDouble);
    m2.add_(p.var.to(at::kDouble), p.count - 1.0).add_((mean_j - mean).square(), p.count);
  }
  BatchStats out;
  out.count = total;
  out.mean = mean;
  out.var = m2 / (total - 1.0);
  out.momentum = parts.front().momentum;
  return out;
}

void update_running_stats(const at::Tensor& running_mean, const at::Tensor& running_var,
                          const BatchStats& stats, double momentum) {
  running_mean.copy_(running_mean.to(at::kDouble) * (1.0 - momentum) +
                     stats.mean.to(at::kDouble) * momentum);
  running_var.copy_(running_var.to(at::kDouble) * (1.0 - momentum) +
                    stats.var.to(at::kDouble) * momentum);
}

void NormWindow::begin(int64_t micro_batches) {
  open_ = true;
  size_ = micro_batches;
  index_ = 0;
  pending_.clear();  // left only by a window that failed before its end
}

void NormWindow::enter(int64_t index) { index_ = index; }

void NormWindow::finish() {
  std::map<const void*, Pending> pending = std::move(pending_);
  pending_.clear();
  open_ = false;
  for (auto& [layer, p] : pending) {
    std::vector<BatchStats> parts;
    for (auto& [index, stats] : p.parts) parts.push_back(std::move(stats));
    const BatchStats pooled = pool(parts);
    update_running_stats(p.running_mean, p.running_var, pooled, pooled.momentum);
  }
}

bool NormWindow::host_updates() const {
  return open_ && size_ > 1 && mode_ != RunningStatsUpdate::kMicroBatch;
}

void NormWindow::record(const void* layer, const at::Tensor& running_mean,
                        const at::Tensor& running_var, BatchStats stats) {
  if (mode_ == RunningStatsUpdate::kAdjustedMomentum) {
    update_running_stats(running_mean, running_var, stats,
                         adjusted_momentum(stats.momentum, size_));
    return;
  }
  Pending& p = pending_[layer];
  p.running_mean = running_mean;
  p.running_var = running_var;
  p.parts[index_] = std::move(stats);
}

}  // namespace kiln::plugin
