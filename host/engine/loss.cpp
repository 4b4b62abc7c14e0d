#include "engine/loss.hpp"

#include <ATen/ops/binary_cross_entropy_with_logits.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <fmt/format.h>

#include <optional>
#include <utility>
#include <vector>

#include "config/pipeline.hpp"
#include "engine/checks.hpp"
#include "plugin/adapters.hpp"

namespace kiln::engine {
namespace {

std::optional<at::Tensor> maybe(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// `values` as a float32 [C] tensor on `device`; undefined when empty. `key` names the list in
// the refusal of a length other than the class count.
at::Tensor per_class(const std::vector<double>& values, int64_t classes, const at::Device& device,
                     const std::string& key) {
  if (values.empty()) return {};
  if (static_cast<int64_t>(values.size()) != classes) {
    throw PipelineError(key, fmt::format("has {} values; the dataset has {} classes, one "
                                         "weight per class",
                                         values.size(), classes));
  }
  return at::tensor(values, at::TensorOptions().dtype(at::kDouble))
      .to(at::TensorOptions().dtype(at::kFloat).device(device));
}

at::Tensor as_float(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
}

}  // namespace

Loss::Loss(const config::LossSettings& settings, int64_t num_classes, at::Device device)
    : settings_(settings), bce_(settings.name == "bce_with_logits") {
  weight_ = per_class(settings.class_weights, num_classes, device, "loss.class_weights");
  if (!settings.pos_weight.empty() && !bce_) {
    throw PipelineError("loss.pos_weight", "applies to name = \"bce_with_logits\" only");
  }
  pos_weight_ = per_class(settings.pos_weight, num_classes, device, "loss.pos_weight");
}

Loss::Loss(std::shared_ptr<const plugin::ModelLossAdapter> model_loss)
    : model_(std::move(model_loss)) {}

at::Tensor Loss::bce_target(const at::Tensor& target, int64_t classes) const {
  const double s = settings_.label_smoothing;
  if (at::isFloatingType(target.scalar_type())) {
    // Smoothing after mixing is timm's Mixup(label_smoothing = s): the mix is affine.
    const at::Tensor p = as_float(target);
    return s > 0.0 ? p * (1.0 - s) + s / static_cast<double>(classes) : p;
  }
  // timm BinaryCrossEntropy: off = s / C, on = 1 - s + off.
  const double off = s / static_cast<double>(classes);
  return at::full({target.size(0), classes}, off,
                  at::TensorOptions().dtype(at::kFloat).device(target.device()))
      .scatter_(1, target.reshape({-1, 1}), 1.0 - s + off);
}

at::Tensor Loss::operator()(const at::Tensor& logits, const at::Tensor& target) const {
  if (model_) return (*model_)(logits, target, /*training=*/true);
  const at::Tensor x = as_float(logits);
  if (bce_) {
    return at::binary_cross_entropy_with_logits(x, bce_target(target, x.size(1)), maybe(weight_),
                                                maybe(pos_weight_), at::Reduction::Mean);
  }
  return at::cross_entropy_loss(x, target, maybe(weight_), at::Reduction::Mean, -100,
                                settings_.label_smoothing);
}

Loss::Sums Loss::sums(const at::Tensor& logits, const at::Tensor& labels) const {
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(logits.device());
  const int64_t n = logits.size(0);
  if (model_) {
    const at::Tensor mean = (*model_)(logits, labels, /*training=*/false);
    return {mean.to(at::kDouble) * static_cast<double>(n),
            at::full({}, static_cast<double>(n), f64)};
  }
  const at::Tensor x = as_float(logits);
  if (bce_) {
    const at::Tensor total = at::binary_cross_entropy_with_logits(
        x, bce_target(labels, x.size(1)), maybe(weight_), maybe(pos_weight_), at::Reduction::Sum);
    return {total.to(at::kDouble), at::full({}, static_cast<double>(x.numel()), f64)};
  }
  const at::Tensor total = at::cross_entropy_loss(x, labels, maybe(weight_), at::Reduction::Sum,
                                                  -100, settings_.label_smoothing);
  const bool weighted = weight_.defined() && !at::isFloatingType(labels.scalar_type());
  return {total.to(at::kDouble), weighted ? weight_.index_select(0, labels).sum().to(at::kDouble)
                                          : at::full({}, static_cast<double>(n), f64)};
}

std::string Loss::describe() const {
  if (model_) return fmt::format("model '{}''s own", model_->name());
  std::string extras;
  const auto add = [&](const std::string& what) { extras += (extras.empty() ? "" : ", ") + what; };
  if (settings_.label_smoothing > 0.0) {
    add(fmt::format("label_smoothing {}", settings_.label_smoothing));
  }
  if (weight_.defined()) add("class weights");
  if (pos_weight_.defined()) add("pos_weight");
  return settings_.name + (extras.empty() ? "" : " (" + extras + ")");
}

std::unique_ptr<Loss> build_loss(const config::Pipeline& p, std::shared_ptr<kiln::Model> model,
                                 int64_t num_classes, at::Device device,
                                 dist::ProcessGroup* group) {
  if (plugin::has_model_loss(*p.model.component)) {
    return std::make_unique<Loss>(
        std::make_shared<plugin::ModelLossAdapter>(*p.model.component, std::move(model), group));
  }
  return std::make_unique<Loss>(p.settings.loss, num_classes, device);
}

std::string first_loss_key_set(const config::LossSettings& s) {
  if (s.name != "cross_entropy") return "loss.name";
  if (s.label_smoothing != 0.0) return "loss.label_smoothing";
  if (!s.class_weights.empty()) return "loss.class_weights";
  if (!s.pos_weight.empty()) return "loss.pos_weight";
  return "";
}

}  // namespace kiln::engine
