// The loss a run trains and evaluates with: the [loss] section's (cross-entropy or binary
// cross-entropy with logits, label smoothing, class weights), or the model's own (its plugin's
// loss slot, ABI 1.8). One object, built once per run, serves the eager window, the CUDA-graphed
// step and evaluation, so the three compute the same thing. Its tensors live on the run's
// device and nothing is read back to the host.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

#include "config/settings.hpp"

namespace kiln {
class Model;
}
namespace kiln::config {
struct Pipeline;
}
namespace kiln::dist {
class ProcessGroup;
}
namespace kiln::plugin {
class ModelLossAdapter;
}

namespace kiln::engine {

class Loss {
 public:
  // [loss] for a dataset of `num_classes` classes on `device`. Throws PipelineError at the key
  // when a list's length is not the class count (loss.class_weights, loss.pos_weight).
  Loss(const config::LossSettings& settings, int64_t num_classes, at::Device device);
  // The model's own loss.
  explicit Loss(std::shared_ptr<const plugin::ModelLossAdapter> model_loss);

  // The batch's mean loss as a float32 0-d tensor, from the logits [N, C] (any floating dtype:
  // [loss] computes in float32) and `target`: int64 labels [N], or float soft targets [N, C]
  // (mixup/cutmix). torch's reductions: cross_entropy's mean divides by the weights of the
  // batch's labels when class weights are set (by N with soft targets); bce's by N x C.
  at::Tensor operator()(const at::Tensor& logits, const at::Tensor& target) const;

  // Evaluation: the batch's summed loss and what its mean divides it by (float64 0-d tensors on
  // the device), so that a split's loss is sum(total) / sum(count), the mean one batch of the
  // whole split would give. A model's own loss gives its mean x N and N.
  struct Sums {
    at::Tensor total, count;
  };
  Sums sums(const at::Tensor& logits, const at::Tensor& labels) const;

  // "cross_entropy (label_smoothing 0.1, class weights)", "model 'x''s own": for the log.
  std::string describe() const;

 private:
  // bce_with_logits' target: one-hot labels, or soft targets, smoothed.
  at::Tensor bce_target(const at::Tensor& target, int64_t classes) const;

  config::LossSettings settings_;
  bool bce_ = false;
  at::Tensor weight_;      // [C] float32 on the device; undefined: none
  at::Tensor pos_weight_;  // [C] float32 on the device; undefined: none
  std::shared_ptr<const plugin::ModelLossAdapter> model_;
};

// The run's loss: the model's own when its plugin has the loss slot (over `model`, its calls'
// context carrying `group`, which may be null), else [loss] for `num_classes` classes on
// `device`. Throws PipelineError as the constructor does.
std::unique_ptr<Loss> build_loss(const config::Pipeline& pipeline,
                                 std::shared_ptr<kiln::Model> model, int64_t num_classes,
                                 at::Device device, dist::ProcessGroup* group = nullptr);

// The first [loss] key set to other than its default ("loss.label_smoothing"), for the refusal
// when the model computes its own loss; "" when all keep their defaults.
std::string first_loss_key_set(const config::LossSettings& settings);

}  // namespace kiln::engine
