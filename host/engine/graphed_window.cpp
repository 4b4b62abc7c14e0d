#include <chrono>
#include <stdexcept>

#include "data/loader.hpp"
#include "engine/graph_step.hpp"
#include "engine/loss_scaler.hpp"
#include "engine/optimizer_step.hpp"
#include "engine/window_pass.hpp"

namespace kiln::engine {

namespace {

using Clock = std::chrono::steady_clock;

class GraphedWindow final : public WindowPass {
 public:
  GraphedWindow(const WindowInputs& in, GraphedStep& graph, const LossScaler& scaler)
      : in_(in), graph_(graph), scaler_(scaler) {}

  void begin() override {}  // GraphedStep drops or zeroes its gradient buffers itself
  // step_graph leaves an optimizer that re-evaluates eager.
  WindowResult rerun(double /*scale*/) override {
    throw std::logic_error("a CUDA-graphed window cannot run its batches again");
  }
  void keep_batches(bool keep) override {
    if (keep) throw std::logic_error("a CUDA-graphed window keeps no batches");
  }

  // A window of one (run.cuda_graph needs accumulation 1).
  WindowResult run(int64_t /*window*/, double scale, int64_t steps_done) override {
    WindowResult w;
    const auto fetch_start = Clock::now();
    std::optional<data::Batch> batch = in_.loader->next();
    w.data_time = std::chrono::duration<double>(Clock::now() - fetch_start).count();
    if (!batch) return w;
    const at::Tensor x = model_input(batch->images, in_);
    // Soft targets (mixup/cutmix) are a float N x classes input of the graph: every batch of
    // a mixing run carries them, so its shape stays static.
    const at::Tensor y = loss_target(*batch, in_.device);
    if (in_.updates->capturable()) in_.updates->set_device_lrs();
    // Captured only once the optimizer has applied a step: its state then exists outside.
    const bool may_capture = steps_done > scaler_.skipped_total();
    GraphedStep::Result r = graph_.run(x, y, scale, may_capture);
    w.check = std::move(r.check);
    w.update_ran = r.updated;
    w.samples = y.size(0);
    w.micro_batches = 1;
    return w;
  }

 private:
  WindowInputs in_;
  GraphedStep& graph_;
  const LossScaler& scaler_;
};

}  // namespace

std::unique_ptr<WindowPass> graphed_window(const WindowInputs& in, GraphedStep& graph,
                                           const LossScaler& scaler) {
  return std::make_unique<GraphedWindow>(in, graph, scaler);
}

}  // namespace kiln::engine
