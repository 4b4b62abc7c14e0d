#include "engine/optimizer_step.hpp"

#include <ATen/core/grad_mode.h>

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
  StepOutcome out;
  out.scale = scaler_.scale();
  stepped_.gather_grads();
  out.check = unscale_check_clip(stepped_.flat(), stepped_.flat_names(), out.scale, clip_, loss);
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
