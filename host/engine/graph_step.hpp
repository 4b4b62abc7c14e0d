// run.cuda_graph: a training step captured once as a CUDA graph and replayed every step after,
// so that the CPU launches one graph instead of the model's hundreds of kernels: what bounds
// small batches on a fast GPU. The graph holds forward, loss, backward, the unscaling check and,
// with a capturable optimizer (KILN_CAP_CAPTURABLE), clipping and the optimizer step, which the
// device skips when the check fails. After each replay the check (overflow flag, norm, loss) is
// read back once, for the loss-scale rule, the schedule and the metrics; with another optimizer,
// clipping and the optimizer then run eagerly.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/gradients.hpp"
#include "engine/precision.hpp"
#include "kiln/torch.hpp"

namespace kiln::engine {

class Loss;

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

  // `loss`: the run's (it must outlive the graph); `params`: the trainable parameters (what the
  // check reads); `norm_type`: the check's p.
  GraphedStep(kiln::Model& model, const Loss& loss, std::vector<at::Tensor> params,
              const PrecisionPlan& plan, double norm_type, at::Device device);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // What the graph runs after the check, given its device readout [found_inf, norm, loss]:
  // clipping and the optimizer, enqueued without reading anything back. Set before the capture;
  // none: the graph ends with the check.
  using Update = std::function<void(const at::Tensor& readout)>;
  void set_update(Update update);

  struct Result {
    GradCheck check;       // read back after the step, with the batch's mean loss
    bool updated = false;  // the replay ran the update (else the caller runs the optimizer)
  };
  // Forward, loss, backward (the loss multiplied by `scale`) and the gradient check on the batch
  // (x, y), already on the device: eagerly for the first kWarmupSteps steps, until
  // `may_capture` (the optimizer's state exists, so that no state is created inside the
  // graph), and for any batch of another shape than the captured one; else by replaying the
  // graph. A capture that fails is reported once (spdlog) and the run goes on eagerly.
  Result run(const at::Tensor& x, const at::Tensor& y, double scale, bool may_capture = true);

  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::engine
