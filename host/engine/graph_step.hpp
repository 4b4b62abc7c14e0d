// run.cuda_graph: a training step's forward, loss, backward and gradient check captured once as
// a CUDA graph and replayed every step after, so that the CPU launches one graph instead of the
// model's hundreds of kernels: what bounds small batches on a fast GPU. After each replay the
// check (overflow flag, norm, loss) is read back once; clipping, the loss-scale update and the
// optimizer then run as usual.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/gradients.hpp"
#include "engine/precision.hpp"
#include "kiln/torch.hpp"

namespace kiln::engine {

// What decides whether a pipeline's step can be captured.
struct GraphConditions {
  bool cuda = false;
  int world_size = 1;
  int64_t accumulation = 1;
  bool master_weights = false;
  bool activation_checkpointing = false;
};

// Empty when the step can be captured, else why not, for the run's message.
std::string graph_unsupported_reason(const GraphConditions& conditions);

class GraphedStep {
 public:
  // Eager steps before the capture: cuDNN's algorithm search and torch's lazy set-ups must
  // happen outside it.
  static constexpr int kWarmupSteps = 3;

  // `params`: the trainable parameters (what the check reads); `norm_type`: the check's p.
  GraphedStep(kiln::Model& model, std::vector<at::Tensor> params, const PrecisionPlan& plan,
              double norm_type, at::Device device);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // Forward, loss, backward (the loss multiplied by `scale`) and the gradient check on the batch
  // (x, y), already on the device: eagerly for the first kWarmupSteps steps and for any batch of
  // another shape than the captured one, else by replaying the graph. Returns the check read
  // back, with the batch's mean loss. A capture that fails is reported once (spdlog) and the run
  // goes on eagerly.
  GradCheck run(const at::Tensor& x, const at::Tensor& y, double scale);

  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::engine
