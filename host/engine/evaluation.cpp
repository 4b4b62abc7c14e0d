#include "engine/evaluation.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "data/loader.hpp"
#include "dist/process_group.hpp"
#include "engine/average_precision.hpp"
#include "engine/loss.hpp"
#include "kiln/torch.hpp"

namespace kiln::engine {
namespace {

// `sum` + `add`, where an undefined `sum` is none yet.
void accumulate(at::Tensor& sum, const at::Tensor& add) { sum = sum.defined() ? sum + add : add; }

double value(const at::Tensor& t) { return t.defined() ? t.item<double>() : 0.0; }

}  // namespace

Evaluation evaluate_model(const WindowInputs& in, dist::ProcessGroup* group) {
  at::NoGradGuard no_grad;
  kiln::Model& model = *in.model;
  model.eval();
  in.loader->start_epoch(0);
  // Sums stay on the device until the end: no host sync per batch.
  at::Tensor loss_total, loss_count, correct_total, top5_total;
  int64_t seen = 0;
  // Multi-label: the batches' scores and target rows, ranked once the split is through.
  std::vector<at::Tensor> score_rows, target_rows;
  while (auto batch = in.loader->next()) {
    const at::Tensor x = model_input(batch->images, in);
    // An evaluation batch has target rows only from multi-label data (it is never mixed).
    const bool multi_label = batch->targets.defined();
    const at::Tensor y = on_device(multi_label ? batch->targets : batch->labels, in.device);
    at::Tensor logits;
    Loss::Sums loss;
    {
      // The loss under autocast as in training; [loss] computes in float32 either way.
      AutocastScope autocast(in.device.type(), in.plan.autocast_dtype, in.plan.autocast);
      logits = model.forward(x);
      loss = in.loss->sums(logits, y);
    }
    const at::Tensor scores = logits.to(at::kFloat);
    accumulate(loss_total, loss.total);
    accumulate(loss_count, loss.count);
    seen += y.size(0);
    if (multi_label) {
      score_rows.push_back(scores);
      target_rows.push_back(y);
      continue;
    }
    const int64_t k = std::min<int64_t>(5, scores.size(1));
    const at::Tensor top = std::get<1>(scores.topk(k, /*dim=*/1));
    accumulate(correct_total, scores.argmax(1).eq(y).sum());
    accumulate(top5_total, top.eq(y.unsqueeze(1)).any(1).sum());
  }
  model.train();
  std::vector<double> sums = {value(loss_total), value(loss_count), value(correct_total),
                              value(top5_total), static_cast<double>(seen)};
  if (group != nullptr) {
    at::Tensor all = at::tensor(sums);
    group->allreduce(all, "sum");
    for (size_t i = 0; i < sums.size(); ++i) sums[i] = all[static_cast<int64_t>(i)].item<double>();
  }
  const double n = sums[4];
  Evaluation e;
  e.loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
  e.accuracy = n > 0 ? sums[2] / n : NAN;
  e.accuracy_top5 = n > 0 ? sums[3] / n : NAN;
  // Every rank ranks the whole split, so that all report the same value. A rank whose shard is
  // empty still takes part in the gathers.
  const bool multi_label = in.loader->multi_label();
  if (multi_label) {
    const int64_t classes = in.loader->num_classes();
    const auto rows = [&](const std::vector<at::Tensor>& parts) {
      const at::Tensor local = parts.empty() ? at::empty({0, classes}, at::kFloat)
                                             : at::cat(parts).to(at::kCPU, at::kFloat);
      return gather_rows(local, group);
    };
    const at::Tensor scores = rows(score_rows);
    const at::Tensor targets = rows(target_rows);
    e.map = mean_average_precision(scores, targets);
    e.multi_label = true;
    e.accuracy = e.accuracy_top5 = NAN;
  }
  return e;
}

}  // namespace kiln::engine
