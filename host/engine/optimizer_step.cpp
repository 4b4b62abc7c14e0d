#include "engine/optimizer_step.hpp"

#include <ATen/core/grad_mode.h>

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

StepOutcome OptimizerStep::run(int64_t step, const at::Tensor& loss) {
  // Parameters are leaves that require grad; updating them in place must not be recorded.
  at::NoGradGuard no_grad;
  stepped_.gather_grads();
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

StepOutcome OptimizerStep::apply(int64_t step, GradCheck check) {
  StepOutcome out;
  out.scale = scaler_.scale();
  out.check = std::move(check);
  out.verdict = scaler_.after_check(out.check.finite);

  const double lr = out.lr = lr_.current();
  out.group_lrs.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) out.group_lrs[g] = lr * groups_[g].lr_scale;
  if (out.verdict == StepVerdict::kApply) {
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
