#include "engine/evaluation.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/tensor.h>

#include <cmath>
#include <vector>

#include "data/loader.hpp"
#include "dist/process_group.hpp"
#include "kiln/torch.hpp"

namespace kiln::engine {

Evaluation evaluate_model(const WindowInputs& in, dist::ProcessGroup* group) {
  at::NoGradGuard no_grad;
  kiln::Model& model = *in.model;
  model.eval();
  in.loader->start_epoch(0);
  // Sums stay on the device until the end: no host sync per batch.
  at::Tensor loss_total, correct_total;
  int64_t seen = 0;
  while (auto batch = in.loader->next()) {
    const at::Tensor x = model_input(batch->images, in);
    const at::Tensor y = on_device(batch->labels, in.device);
    at::Tensor logits;
    {
      AutocastScope autocast(in.device.type(), in.plan.autocast_dtype, in.plan.autocast);
      logits = model.forward(x).to(at::kFloat);
    }
    at::Tensor loss = at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).to(at::kDouble);
    at::Tensor correct = logits.argmax(1).eq(y).sum();
    loss_total = loss_total.defined() ? loss_total + loss : loss;
    correct_total = correct_total.defined() ? correct_total + correct : correct;
    seen += y.size(0);
  }
  model.train();
  double loss_sum = loss_total.defined() ? loss_total.item<double>() : 0.0;
  int64_t correct = correct_total.defined() ? correct_total.item<int64_t>() : 0;
  if (group != nullptr) {
    at::Tensor sums = at::tensor(
        std::vector<double>{loss_sum, static_cast<double>(correct), static_cast<double>(seen)});
    group->allreduce(sums, "sum");
    loss_sum = sums[0].item<double>();
    correct = static_cast<int64_t>(sums[1].item<double>());
    seen = static_cast<int64_t>(sums[2].item<double>());
  }
  return {seen ? static_cast<double>(correct) / seen : NAN, seen ? loss_sum / seen : NAN};
}

}  // namespace kiln::engine
