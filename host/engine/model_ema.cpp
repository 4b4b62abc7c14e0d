#include "engine/model_ema.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_lerp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/master_weights.hpp"

namespace kiln::engine {

double ema_decay(const config::EmaSettings& s, int64_t step) {
  const int64_t k = std::max<int64_t>(0, step - s.start_step - 1);
  if (k == 0) return 0.0;
  if (!s.warmup) return s.decay;
  const double warm =
      1.0 - std::pow(1.0 + static_cast<double>(k) / s.warmup_gamma, -s.warmup_power);
  return std::max(std::min(warm, s.decay), 0.0);  // timm's min_decay defaults to 0
}

std::vector<std::pair<std::string, at::Tensor>> saved_average(const io::CheckpointData& data) {
  const std::string prefix = kEmaPrefix;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, tensor] : data.trainer) {
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), tensor);
  }
  return out;
}

ModelEma::ModelEma(torch::nn::Module& model, const MasterWeights& stepped,
                   const config::EmaSettings& settings)
    : settings_(settings) {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> masters;
  for (size_t i = 0; i < stepped.flat().size(); ++i) {
    masters.emplace(stepped.flat_names()[i], stepped.flat()[i]);
  }
  auto add = [&](const std::string& name, const at::Tensor& tensor, bool buffer) {
    const auto master = buffer ? masters.end() : masters.find(name);
    const at::Tensor source = master != masters.end() ? master->second : tensor;
    // A half average could not move by 1 - decay = 1e-4 of a weight's size.
    const bool half = source.is_floating_point() && source.element_size() < 4;
    const at::Tensor average =
        source.detach().to(half ? at::kFloat : source.scalar_type(), false, /*copy=*/true);
    names_.push_back(name);
    model_.push_back(tensor);
    source_.push_back(source);
    average_.push_back(average);
    if (!source.is_floating_point() || (buffer && !settings.average_buffers)) {
      copy_average_.push_back(average);
      copy_source_.push_back(source);
    } else if (half) {
      cast_lerped_.push_back(names_.size() - 1);
    } else {
      lerp_average_.push_back(average);
      lerp_source_.push_back(source);
    }
  };
  for (const auto& item : model.named_parameters()) add(item.key(), item.value(), false);
  for (const auto& item : model.named_buffers()) add(item.key(), item.value(), true);
}

void ModelEma::update(int64_t step) {
  at::NoGradGuard no_grad;
  const double weight = 1.0 - ema_decay(settings_, step);
  if (!lerp_average_.empty()) at::_foreach_lerp_(lerp_average_, lerp_source_, weight);
  for (const size_t i : cast_lerped_) {
    average_[i].lerp_(source_[i].to(average_[i].scalar_type()), weight);
  }
  if (!copy_average_.empty()) at::_foreach_copy_(copy_average_, copy_source_);
}

std::vector<std::pair<std::string, at::Tensor>> ModelEma::named() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(names_.size());
  for (size_t i = 0; i < names_.size(); ++i) out.emplace_back(kEmaPrefix + names_[i], average_[i]);
  return out;
}

void ModelEma::state(io::CheckpointData& out) const {
  for (auto& entry : named()) out.trainer.push_back(std::move(entry));
}

void ModelEma::restore(const io::CheckpointData& data) {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> saved;
  for (auto& [name, tensor] : saved_average(data)) saved.emplace(name, tensor);
  if (saved.empty()) {
    for (size_t i = 0; i < names_.size(); ++i) average_[i].copy_(source_[i]);
    spdlog::info(
        "ema: the checkpoint holds no average (ema.decay was 0); it starts from the "
        "checkpoint's weights");
    return;
  }
  for (size_t i = 0; i < names_.size(); ++i) {
    const auto it = saved.find(names_[i]);
    if (it == saved.end()) {
      throw io::CheckpointError(std::string("checkpoint has no tensor '") + kEmaPrefix + names_[i] +
                                "'");
    }
    if (it->second.sizes() != average_[i].sizes()) {
      throw io::CheckpointError(std::string("checkpoint tensor '") + kEmaPrefix + names_[i] +
                                "' has another shape");
    }
    average_[i].copy_(it->second);
  }
}

void ModelEma::swap_in() {
  at::NoGradGuard no_grad;
  trained_.clear();
  trained_.reserve(model_.size());
  for (size_t i = 0; i < model_.size(); ++i) {
    trained_.push_back(model_[i].clone());
    model_[i].copy_(average_[i]);
  }
}

void ModelEma::swap_out() {
  at::NoGradGuard no_grad;
  if (!trained_.empty()) at::_foreach_copy_(model_, trained_);
  trained_.clear();
}

}  // namespace kiln::engine
