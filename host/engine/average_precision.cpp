#include "engine/average_precision.hpp"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/max.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "dist/process_group.hpp"

namespace kiln::engine {

double mean_average_precision(const at::Tensor& scores, const at::Tensor& targets) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  const at::Tensor s = scores.to(at::kCPU, at::kDouble).contiguous();
  const at::Tensor t = targets.to(at::kCPU, at::kFloat).contiguous();
  const int64_t n = s.size(0), classes = s.size(1);
  const double* sp = s.const_data_ptr<double>();
  const float* tp = t.const_data_ptr<float>();
  if (std::any_of(sp, sp + s.numel(), [](double v) { return std::isnan(v); })) return kNaN;

  std::vector<int64_t> order(static_cast<size_t>(n));
  double sum = 0.0;
  int64_t counted = 0;
  for (int64_t c = 0; c < classes; ++c) {
    const auto score = [&](int64_t i) { return sp[i * classes + c]; };
    const auto positive = [&](int64_t i) { return tp[i * classes + c] >= 0.5F; };
    int64_t positives = 0;
    for (int64_t i = 0; i < n; ++i) positives += positive(i) ? 1 : 0;
    if (positives == 0) continue;
    std::iota(order.begin(), order.end(), int64_t{0});
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return score(a) > score(b); });
    // Each group of tied scores is one threshold: its positives raise the recall by their share,
    // at the precision of the whole ranking down to the group's end.
    double ap = 0.0;
    int64_t hits = 0;
    for (int64_t i = 0; i < n;) {
      int64_t j = i, group_hits = 0;
      for (; j < n && score(order[j]) == score(order[i]); ++j) {
        group_hits += positive(order[j]) ? 1 : 0;
      }
      hits += group_hits;
      ap += static_cast<double>(group_hits) * (static_cast<double>(hits) / static_cast<double>(j));
      i = j;
    }
    // Divided once: a perfect ranking then sums to exactly `positives` and gives exactly 1.
    sum += ap / static_cast<double>(positives);
    ++counted;
  }
  return counted > 0 ? sum / static_cast<double>(counted) : kNaN;
}

at::Tensor gather_rows(const at::Tensor& rows, dist::ProcessGroup* group) {
  if (group == nullptr || group->world_size() == 1) return rows;
  const int world = group->world_size();
  // The counts first, so that every rank pads to the longest shard and trims the padding.
  at::Tensor count = at::tensor({rows.size(0)}, at::kLong);
  at::Tensor counts = at::empty({world}, at::kLong);
  group->allgather(count, counts);
  const int64_t longest = counts.max().item<int64_t>();
  at::Tensor padded = at::zeros({longest, rows.size(1)}, rows.options());
  padded.narrow(0, 0, rows.size(0)).copy_(rows);
  at::Tensor all = at::empty({world * longest, rows.size(1)}, rows.options());
  group->allgather(padded, all);
  std::vector<at::Tensor> parts;
  for (int r = 0; r < world; ++r) {
    parts.push_back(all.narrow(0, r * longest, counts[r].item<int64_t>()));
  }
  return at::cat(parts);
}

}  // namespace kiln::engine
