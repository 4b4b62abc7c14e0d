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
// The workload `optimizer` steps: ResNet-50's (`resnet`) for all but "muon", which steps 2-D
// parameters only and gets ResNet-50's weights of two or more dimensions as matrices (a conv
// weight [out, in, kh, kw] as [out, in * kh * kw], fc.weight as it is; the same values);
// bench/optimizer_step.py's workload_for mirrors this.
Workload workload_for(const std::string& optimizer, const Workload& resnet);

class Arm {
 public:
  virtual ~Arm() = default;
  virtual void step() = 0;
  // What runs, with its hyperparameters, for the report.
  virtual std::string description() const = 0;
};

// The Kiln optimizer `optimizer` from `registry` ("sgd", "adamw", "lion", "nadam", ...; a wrapper
// such as "lookahead" with its inner optimizer); nullptr with `skip` set when the plugin folder has
// no such plugin. `work`: the workload_for the optimizer.
std::unique_ptr<Arm> make_kiln_arm(const plugin::Registry& registry, const std::string& optimizer,
                                   const Workload& work, std::string& skip);
// torch::optim::SGD, AdamW or Adagrad; throws for another name.
std::unique_ptr<Arm> make_torch_arm(const std::string& optimizer, const Workload& work);

}  // namespace kiln::bench
