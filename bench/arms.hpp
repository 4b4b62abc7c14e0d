// The benchmarked optimizers ("arms"): each owns its copy of ResNet-50's parameters (sharing the
// fixed gradients) and applies one step per call, either a Kiln plugin through the engine's own
// path (OptimizerAdapter, state in the host's StateStore) or torch::optim in C++.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "plugin/registry.hpp"

namespace kiln::bench {

// Parameter names, initial values and gradients (float32, contiguous, CPU).
struct Workload {
  std::vector<std::string> names;
  std::vector<at::Tensor> init;
  std::vector<at::Tensor> grads;
};
Workload make_workload();

class Arm {
 public:
  virtual ~Arm() = default;
  virtual void step() = 0;
  // What runs, with its hyperparameters, for the report.
  virtual std::string description() const = 0;
};

// "sgd", "adamw" or "lion" from `registry`; nullptr with `skip` set when there is no such plugin.
std::unique_ptr<Arm> make_kiln_arm(const plugin::Registry& registry, const std::string& optimizer,
                                   const Workload& work, std::string& skip);
// torch::optim::SGD or AdamW; throws for another name.
std::unique_ptr<Arm> make_torch_arm(const std::string& optimizer, const Workload& work);

}  // namespace kiln::bench
