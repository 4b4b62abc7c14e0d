// The tensors the optimizer steps. Without master weights these are the model's parameters;
// with them (O2), every half-precision parameter gets an fp32 copy that the optimizer updates,
// its gradient copied up before the step and its value cast down into the model after it.
// fp32 parameters (norm layers kept in fp32) are stepped in place, as apex does.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "engine/param_groups.hpp"

namespace kiln::engine {

class MasterWeights {
 public:
  // `model_groups` are the model's parameter groups (kept by reference; they must outlive this).
  MasterWeights(const std::vector<ParamGroup>& model_groups, bool enabled);

  // Same names, scales and order as the model's groups; params are the tensors to step.
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // Every tensor the optimizer steps, in group order (for gradient passes over all of them).
  const std::vector<at::Tensor>& flat() const { return flat_; }
  const std::vector<std::string>& flat_names() const { return flat_names_; }

  // Before the optimizer: the steppable tensors' .grad are the model's gradients (copied to
  // fp32 for master copies; parameters without a gradient have none).
  void gather_grads();
  // After an applied step: the model's half parameters take the masters' new values.
  void publish();
  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  std::vector<ParamGroup> groups_;
  std::vector<at::Tensor> flat_;
  std::vector<std::string> flat_names_;
  // Master copies and the model parameters they shadow, pairwise; their fp32 gradient buffers.
  std::vector<at::Tensor> masters_, shadowed_, master_grads_;
};

}  // namespace kiln::engine
