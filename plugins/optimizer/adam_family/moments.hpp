// What NAdam and RAdam share in torch's multi-tensor order (header-only): the weight decay,
// added to the gradient (L2) or applied to the weights (decoupled, as AdamW), then Adam's two
// moments, on one chunk of a bucket (common/chunked.hpp).
#ifndef KILN_PLUGINS_OPTIMIZER_ADAM_FAMILY_MOMENTS_HPP_
#define KILN_PLUGINS_OPTIMIZER_ADAM_FAMILY_MOMENTS_HPP_

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>

#include <vector>

namespace kiln::adam_family {

struct MomentSettings {
  double lr, weight_decay, beta1, beta2;
  bool decoupled;  // weight decay on the weights (AdamW's), not added to the gradient
};

// Applies the weight decay and moves exp_avg and exp_avg_sq; returns the gradients the moments
// took (with the L2 term when not decoupled).
inline std::vector<at::Tensor> decay_and_moments(const MomentSettings& m,
                                                 const std::vector<at::Tensor>& params,
                                                 std::vector<at::Tensor> grads,
                                                 const std::vector<at::Tensor>& exp_avg,
                                                 const std::vector<at::Tensor>& exp_avg_sq) {
  if (m.weight_decay != 0.0) {
    if (m.decoupled) {
      at::_foreach_mul_(params, 1.0 - m.lr * m.weight_decay);
    } else {
      grads = at::_foreach_add(grads, params, m.weight_decay);
    }
  }
  at::_foreach_lerp_(exp_avg, grads, 1.0 - m.beta1);
  at::_foreach_mul_(exp_avg_sq, m.beta2);
  at::_foreach_addcmul_(exp_avg_sq, grads, grads, 1.0 - m.beta2);
  return grads;
}

}  // namespace kiln::adam_family

#endif  // KILN_PLUGINS_OPTIMIZER_ADAM_FAMILY_MOMENTS_HPP_
