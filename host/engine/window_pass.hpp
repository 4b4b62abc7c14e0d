// The forward and backward half of an optimizer step: a window of micro-batches taken from the
// loader, each run forward (loss under autocast) and backward, gradients accumulated. Eager and
// CUDA-graphed windows are two implementations of one interface, so the step reads the same
// either way.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "engine/gradients.hpp"
#include "engine/precision.hpp"

namespace kiln {
class Model;
namespace data {
class Loader;
struct Batch;
}  // namespace data
namespace dist {
class DataParallel;
}
namespace plugin {
class NormWindow;
}
}  // namespace kiln

namespace kiln::engine {

class GraphedStep;
class Loss;
class LossScaler;
class OptimizerStep;

// What a window did.
struct WindowResult {
  int64_t samples = 0;        // on this rank; 0: the loader ran dry before the window began
  int64_t micro_batches = 0;  // run (fewer than asked when the loader ran dry)
  double data_time = 0.0;     // seconds waiting for batches
  // The window's loss on the device, for the update's single read-back: a window of one keeps
  // its mean loss; longer ones sum loss x batch size. Undefined for a graphed window.
  at::Tensor loss;
  std::optional<GradCheck> check;  // a graphed window: the check its replay read back
  bool update_ran = false;         // and whether the replay also ran the optimizer
};

class WindowPass {
 public:
  virtual ~WindowPass() = default;
  // Before the step's memory baseline: an eager window drops the gradients (set_to_none); a
  // graph keeps its gradient buffers.
  virtual void begin() = 0;
  // `window` micro-batches, the loss multiplied by `scale` / window before backward.
  // `steps_done`: optimizer steps taken before this one.
  virtual WindowResult run(int64_t window, double scale, int64_t steps_done) = 0;
  // The last run's micro-batches again, at the weights as they now are, gradients accumulated
  // into the model's (an optimizer's re-evaluation); only after keep_batches(true).
  virtual WindowResult rerun(double scale) = 0;
  // Whether run() keeps its micro-batches for rerun().
  virtual void keep_batches(bool keep) = 0;
};

// What both kinds of window read.
struct WindowInputs {
  data::Loader* loader = nullptr;
  kiln::Model* model = nullptr;
  at::Device device{at::kCPU};
  PrecisionPlan plan;
  bool channels_last = false;
  OptimizerStep* updates = nullptr;
  const Loss* loss = nullptr;  // the run's loss (engine/loss.hpp)
};

// Eager: with data parallelism (`ddp`, may be null) the window's last backward all-reduces, or
// every one with `sync_every_micro_step`; `norm_window` (may be null) moves the norm layers'
// running statistics when the host owns that.
std::unique_ptr<WindowPass> eager_window(const WindowInputs& in, dist::DataParallel* ddp,
                                         plugin::NormWindow* norm_window,
                                         bool sync_every_micro_step);

// One CUDA graph per step (a window of one micro-batch), captured once the optimizer has
// applied a step so that its state exists outside the graph.
std::unique_ptr<WindowPass> graphed_window(const WindowInputs& in, GraphedStep& graph,
                                           const LossScaler& scaler);

// `t` on `device`: asynchronous from the loader's pinned memory; a tensor already there is taken
// as it is, without a call through the dispatcher.
at::Tensor on_device(const at::Tensor& t, const c10::Device& device);
// What the loss compares the logits with, on `device`: the batch's soft targets where it has
// them (mixup/cutmix: float [N, C], probabilities for cross_entropy), else its labels.
at::Tensor loss_target(const data::Batch& batch, const c10::Device& device);
// A batch's images on the run's device, in the model's dtype and memory layout.
at::Tensor model_input(const at::Tensor& images, const WindowInputs& in);

}  // namespace kiln::engine
