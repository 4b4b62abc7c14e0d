#include "engine/optimizer_step.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/zeros.h>

#include <stdexcept>
#include <utility>

namespace kiln::engine {

OptimizerStep::OptimizerStep(const std::vector<ParamGroup>& groups, const PrecisionPlan& plan,
                             plugin::OptimizerAdapter& optimizer, LossScaler& scaler, LrDriver& lr,
                             const ClipSettings& clip)
    : groups_(groups),
      stepped_(groups, plan.master_weights),
      optimizer_(optimizer),
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
  const bool needs_pass = scaler_.scale() != 1.0 || clip_.any();
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

bool OptimizerStep::capturable() const { return optimizer_.capturable() && !stepped_.enabled(); }

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
    plugin::GroupStep view;
    view.params = &stepped_.groups()[g].params;
    view.names = &stepped_.groups()[g].names;
    view.group_index = g;
    // Both stale in a replay: capturable plugins count steps and read the lr on the device.
    view.step = step - scaler_.skipped_total();
    view.lr = lr_.current() * groups_[g].lr_scale;
    view.weight_decay = groups_[g].weight_decay;
    view.lr_tensor = device_lrs_[g];
    view.found_inf = found_inf_;
    optimizer_.step(view);
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
    for (size_t g = 0; g < groups_.size(); ++g) {
      plugin::GroupStep view;
      view.params = &stepped_.groups()[g].params;
      view.names = &stepped_.groups()[g].names;
      view.group_index = g;
      view.step = step - scaler_.skipped_total();  // applied steps, this one included
      view.lr = out.group_lrs[g];
      view.weight_decay = groups_[g].weight_decay;
      optimizer_.step(view);
    }
    stepped_.publish();
  }
  lr_.advance(/*applied=*/out.verdict == StepVerdict::kApply);
  return out;
}

}  // namespace kiln::engine
