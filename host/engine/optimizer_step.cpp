#include "engine/optimizer_step.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <stdexcept>
#include <utility>

#include "dist/process_group.hpp"

namespace kiln::engine {

OptimizerStep::OptimizerStep(const std::vector<ParamGroup>& groups, const PrecisionPlan& plan,
                             std::vector<plugin::OptimizerAdapter*> optimizers, LossScaler& scaler,
                             LrDriver& lr, const ClipSettings& clip,
                             dist::ProcessGroup* process_group)
    : groups_(groups),
      stepped_(groups, plan.master_weights),
      optimizers_(std::move(optimizers)),
      process_group_(process_group),
      scaler_(scaler),
      lr_(lr),
      clip_(clip) {
  for (const auto& g : groups_) {
    model_params_.insert(model_params_.end(), g.params.begin(), g.params.end());
  }
}

void OptimizerStep::zero_grad() {
  for (auto& p : model_params_) p.mutable_grad() = at::Tensor();
}

StepOutcome OptimizerStep::run(int64_t step, const at::Tensor& loss, bool check_gradients) {
  // Parameters are leaves that require grad; updating them in place must not be recorded.
  at::NoGradGuard no_grad;
  stepped_.gather_grads();
  // A re-evaluating optimizer is handed the window's loss, which the pass reads.
  const bool needs_pass = scaler_.scale() != 1.0 || clip_.any() || reevaluates();
  if (!check_gradients && !needs_pass && loss.defined()) {
    return apply(step, check_loss_only(stepped_.flat(), stepped_.flat_names(), loss));
  }
  return apply(step, unscale_check_clip(stepped_.flat(), stepped_.flat_names(), scaler_.scale(),
                                        clip_, loss));
}

StepOutcome OptimizerStep::run_after_check(int64_t step, const GradCheck& read) {
  at::NoGradGuard no_grad;
  if (stepped_.enabled()) {
    throw std::logic_error("a check read before the step cannot cover master weights");
  }
  return apply(step, clip_after_check(read, stepped_.flat(), stepped_.flat_names(), clip_));
}

bool OptimizerStep::capturable() const {
  for (const plugin::OptimizerAdapter* o : optimizers_) {
    if (!o->capturable()) return false;
  }
  return !stepped_.enabled();
}

bool OptimizerStep::reevaluates() const {
  for (const plugin::OptimizerAdapter* o : optimizers_) {
    if (o->steps_all()) return true;
  }
  return false;
}

bool OptimizerStep::has_eval_weights() const {
  for (const plugin::OptimizerAdapter* o : optimizers_) {
    if (o->has_eval_weights()) return true;
  }
  return false;
}

void OptimizerStep::set_device_lrs() {
  if (device_lrs_.empty()) {
    const at::Tensor& first = stepped_.flat().front();
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(first.device());
    for (size_t g = 0; g < groups_.size(); ++g) device_lrs_.push_back(at::zeros({}, f32));
    found_inf_ = at::zeros({}, f32);
  }
  const double lr = lr_.current();
  for (size_t g = 0; g < groups_.size(); ++g) device_lrs_[g].fill_(lr * groups_[g].lr_scale);
}

void OptimizerStep::enqueue_update(int64_t step, const at::Tensor& readout) {
  if (!capturable()) throw std::logic_error("enqueue_update: the optimizer is not capturable");
  if (device_lrs_.empty()) throw std::logic_error("enqueue_update before set_device_lrs");
  at::NoGradGuard no_grad;
  // Failed: the unscaling kernel's flag, or a norm that is not finite (unscaled runs).
  const at::Tensor flag = readout.select(0, 0);
  const at::Tensor norm = readout.select(0, 1);
  found_inf_.copy_(at::logical_or(flag.ne(0), at::isfinite(norm).logical_not()));
  clip_on_device(stepped_.flat(), norm, clip_);
  for (size_t g = 0; g < groups_.size(); ++g) {
    // Both stale in a replay: capturable plugins count steps and read the lr on the device.
    plugin::GroupStep view =
        group_step(g, step - scaler_.skipped_total(), lr_.current() * groups_[g].lr_scale);
    view.lr_tensor = device_lrs_[g];
    view.found_inf = found_inf_;
    optimizers_[groups_[g].optimizer]->step(view);
  }
}

StepOutcome OptimizerStep::after_device_update(int64_t step, const GradCheck& read) {
  at::NoGradGuard no_grad;
  // Clipping already ran on the device: only the names of non-finite gradients are left.
  return apply(step, clip_after_check(read, stepped_.flat(), stepped_.flat_names(), {}),
               /*update_ran=*/true);
}

StepOutcome OptimizerStep::apply(int64_t step, GradCheck check, bool update_ran) {
  StepOutcome out;
  out.scale = scaler_.scale();
  out.check = std::move(check);
  out.verdict = scaler_.after_check(out.check.finite);

  const double lr = out.lr = lr_.current();
  out.group_lrs.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) out.group_lrs[g] = lr * groups_[g].lr_scale;
  if (out.verdict == StepVerdict::kApply && !update_ran) {
    // Applied steps, this one included.
    // The window's loss only for an optimizer that takes it (averaging it is a collective).
    const double loss =
        reevaluates() ? mean_loss(out.check.loss, window_micro_batches_, window_samples_) : NAN;
    out.reevaluations = step_optimizers(step - scaler_.skipped_total(), out.group_lrs, loss);
    stepped_.publish();
  }
  if (out.verdict == StepVerdict::kApply) {
    last_step_ = step - scaler_.skipped_total();
    last_group_lrs_ = out.group_lrs;
  }
  lr_.advance(/*applied=*/out.verdict == StepVerdict::kApply);
  return out;
}

plugin::GroupStep OptimizerStep::group_step(size_t g, int64_t step, double lr) const {
  plugin::GroupStep view;
  view.params = &stepped_.groups()[g].params;
  view.names = &stepped_.groups()[g].names;
  view.group_index = g;
  view.step = step;
  view.lr = lr;
  view.weight_decay = groups_[g].weight_decay;
  return view;
}

int64_t OptimizerStep::step_optimizers(int64_t step, const std::vector<double>& group_lrs,
                                       double loss) {
  reevaluations_ = 0;
  for (size_t k = 0; k < optimizers_.size(); ++k) {
    plugin::OptimizerAdapter& optimizer = *optimizers_[k];
    std::vector<plugin::GroupStep> views;
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (groups_[g].optimizer == k) views.push_back(group_step(g, step, group_lrs[g]));
    }
    if (!optimizer.steps_all()) {
      for (const plugin::GroupStep& view : views) optimizer.step(view);
      continue;
    }
    const plugin::Reevaluate closure = [this] { return reevaluate(); };
    optimizer.step_all(views, loss, closure);
  }
  return reevaluations_;
}

kiln_reevaluation OptimizerStep::reevaluate() {
  if (!rerun_) throw std::logic_error("this run has no window to evaluate again");
  // The weights the optimizer wrote reach the model (cast down from fp32 masters).
  stepped_.publish();
  // The optimizer holds views of these gradients: the new ones go into the same memory.
  std::vector<at::Tensor> held;
  held.reserve(model_params_.size());
  for (at::Tensor& p : model_params_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
    held.push_back(p.grad());
  }
  WindowResult w;
  {
    at::AutoGradMode grad_mode(true);
    w = rerun_(scaler_.scale());
  }
  // Data parallelism's reducer may hand back gradients in tensors of its own.
  for (size_t i = 0; i < model_params_.size(); ++i) {
    at::Tensor& grad = model_params_[i].mutable_grad();
    if (!held[i].defined() || !grad.defined() || grad.is_same(held[i])) continue;
    held[i].copy_(grad);
    grad = held[i];
  }
  stepped_.gather_grads();
  const GradCheck check = unscale_check_clip(stepped_.flat(), stepped_.flat_names(),
                                             scaler_.scale(), ClipSettings{}, w.loss);
  ++reevaluations_;
  kiln_reevaluation out{};
  out.struct_size = sizeof(out);
  out.loss = mean_loss(check.loss, w.micro_batches, w.samples);
  out.finite = check.finite ? 1 : 0;
  return out;
}

double OptimizerStep::mean_loss(double read, int64_t micro_batches, int64_t samples) const {
  double mean = micro_batches > 1 && samples > 0 ? read / static_cast<double>(samples) : read;
  if (process_group_ == nullptr || std::isnan(mean)) return mean;
  at::Tensor sum = at::full({1}, mean, at::TensorOptions().dtype(at::kDouble));
  process_group_->allreduce(sum, "sum");
  return sum.item<double>() / static_cast<double>(process_group_->world_size());
}

std::vector<at::Tensor> OptimizerStep::group_eval_weights(size_t g) const {
  plugin::OptimizerAdapter& optimizer = *optimizers_[groups_[g].optimizer];
  if (!optimizer.has_eval_weights()) return {};
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> weights;
  for (const at::Tensor& p : stepped_.groups()[g].params) weights.push_back(at::empty_like(p));
  const double lr = g < last_group_lrs_.size() ? last_group_lrs_[g] : 0.0;
  optimizer.eval_weights(group_step(g, last_step_, lr), weights);
  return weights;
}

std::vector<std::pair<std::string, at::Tensor>> OptimizerStep::eval_weights() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::vector<at::Tensor> weights = group_eval_weights(g);
    for (size_t i = 0; i < weights.size(); ++i) {
      out.emplace_back(stepped_.groups()[g].names[i], weights[i]);
    }
  }
  return out;
}

// The model's own parameters take the weights (cast down from fp32 masters where there are).
void OptimizerStep::swap_in_eval_weights() {
  at::NoGradGuard no_grad;
  trained_.clear();
  swapped_.clear();
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::vector<at::Tensor> weights = group_eval_weights(g);
    for (size_t i = 0; i < weights.size(); ++i) {
      at::Tensor target = groups_[g].params[i];
      trained_.push_back(target.clone());
      swapped_.push_back(target);
      target.copy_(weights[i]);
    }
  }
}

void OptimizerStep::swap_out_eval_weights() {
  at::NoGradGuard no_grad;
  if (!swapped_.empty()) at::_foreach_copy_(swapped_, trained_);
  trained_.clear();
  swapped_.clear();
}

}  // namespace kiln::engine
