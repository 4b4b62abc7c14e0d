#include "engine/master_weights.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/empty_like.h>

namespace kiln::engine {

MasterWeights::MasterWeights(const std::vector<ParamGroup>& model_groups, bool enabled)
    : enabled_(enabled), groups_(model_groups) {
  for (auto& group : groups_) {
    for (size_t i = 0; i < group.params.size(); ++i) {
      at::Tensor& p = group.params[i];
      if (enabled_ && p.scalar_type() != at::kFloat) {
        at::Tensor master = p.detach().to(at::kFloat).requires_grad_(true);
        masters_.push_back(master);
        shadowed_.push_back(p);
        master_grads_.push_back(at::empty_like(master));
        p = master;
      }
      flat_.push_back(p);
      flat_names_.push_back(group.names[i]);
    }
  }
}

void MasterWeights::gather_grads() {
  if (masters_.empty()) return;
  std::vector<at::Tensor> from, to;
  from.reserve(masters_.size());
  to.reserve(masters_.size());
  for (size_t i = 0; i < masters_.size(); ++i) {
    const at::Tensor& grad = shadowed_[i].grad();
    if (!grad.defined()) {
      masters_[i].mutable_grad() = at::Tensor();
      continue;
    }
    from.push_back(grad);
    to.push_back(master_grads_[i]);
    masters_[i].mutable_grad() = master_grads_[i];
  }
  // One multi-tensor copy (with the cast) instead of a kernel per parameter.
  if (!to.empty()) at::_foreach_copy_(to, from);
}

void MasterWeights::publish() {
  if (masters_.empty()) return;
  at::NoGradGuard no_grad;  // the model's parameters are leaves that require grad
  at::_foreach_copy_(shadowed_, masters_);
}

}  // namespace kiln::engine
