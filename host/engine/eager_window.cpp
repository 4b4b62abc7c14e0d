#include <chrono>
#include <stdexcept>
#include <utility>
#include <vector>

#include "data/loader.hpp"
#include "dist/data_parallel.hpp"
#include "engine/loss.hpp"
#include "engine/memory_format.hpp"
#include "engine/optimizer_step.hpp"
#include "engine/window_pass.hpp"
#include "kiln/torch.hpp"
#include "plugin/norm_window.hpp"

namespace kiln::engine {

at::Tensor on_device(const at::Tensor& t, const c10::Device& device) {
  return t.device() == device ? t : t.to(device, /*non_blocking=*/true);
}

at::Tensor loss_target(const data::Batch& batch, const c10::Device& device) {
  return on_device(batch.targets.defined() ? batch.targets : batch.labels, device);
}

at::Tensor model_input(const at::Tensor& images, const WindowInputs& in) {
  at::Tensor x = on_device(images, in.device);
  if (in.plan.half_model()) x = x.to(in.plan.model_dtype);
  return in_model_layout(x, in.channels_last);
}

namespace {

using Clock = std::chrono::steady_clock;

class EagerWindow final : public WindowPass {
 public:
  EagerWindow(const WindowInputs& in, dist::DataParallel* ddp, plugin::NormWindow* norm_window,
              bool sync_every_micro_step)
      : in_(in), ddp_(ddp), norm_window_(norm_window), sync_every_(sync_every_micro_step) {}

  void begin() override { in_.updates->zero_grad(); }

  WindowResult run(int64_t window, double scale, int64_t /*steps_done*/) override {
    WindowResult w;
    kept_.clear();
    if (norm_window_) norm_window_->begin(window);
    for (int64_t micro = 0; micro < window; ++micro) {
      const auto fetch_start = Clock::now();
      std::optional<data::Batch> batch = in_.loader->next();
      w.data_time += std::chrono::duration<double>(Clock::now() - fetch_start).count();
      if (!batch) break;
      at::Tensor x = model_input(batch->images, in_);
      at::Tensor y = loss_target(*batch, in_.device);
      // Copies: the loader may hand the memory of these batches to later ones.
      if (keep_) kept_.push_back({x.clone(), y.clone()});
      const at::Tensor loss = forward_backward(x, y, micro, window, scale);
      accumulate(w, loss, batch->labels.size(0));
    }
    if (norm_window_) norm_window_->finish();  // pooled running statistics, once per step
    return w;
  }

  WindowResult rerun(double scale) override {
    if (!keep_) throw std::logic_error("rerun: the window keeps no batches");
    WindowResult w;
    const auto window = static_cast<int64_t>(kept_.size());
    if (norm_window_) norm_window_->begin(window);
    for (int64_t micro = 0; micro < window; ++micro) {
      const auto& [x, y] = kept_[static_cast<size_t>(micro)];
      const at::Tensor loss = forward_backward(x, y, micro, window, scale);
      accumulate(w, loss, x.size(0));
    }
    if (norm_window_) norm_window_->finish();
    return w;
  }

  void keep_batches(bool keep) override {
    keep_ = keep;
    kept_.clear();
  }

 private:
  at::Tensor forward_backward(const at::Tensor& x, const at::Tensor& y, int64_t micro,
                              int64_t window, double scale) {
    // The window's last backward all-reduces (the Reducer averages over the ranks); the ones
    // before only accumulate, as under DDP's no_sync().
    const bool sync = sync_every_ || micro == window - 1;
    if (ddp_) ddp_->before_forward(/*window_start=*/micro == 0, sync);
    if (norm_window_) norm_window_->enter(micro);
    at::Tensor loss;
    {
      // Forward and loss under autocast, as torch.amp recommends; backward outside it.
      AutocastScope autocast(in_.device.type(), in_.plan.autocast_dtype, in_.plan.autocast);
      loss = (*in_.loss)(in_.model->forward(x), y);
    }
    const double factor = scale / static_cast<double>(window);
    if (ddp_) ddp_->before_backward(sync, loss);
    (factor == 1.0 ? loss : loss * factor).backward();
    return loss.detach();
  }

  // A window of one keeps its mean loss as it is (a multiply per step would buy nothing);
  // longer windows sum loss x batch size.
  static void accumulate(WindowResult& w, const at::Tensor& loss, int64_t batch) {
    if (w.micro_batches == 0) {
      w.loss = loss;
    } else {
      if (w.micro_batches == 1) w.loss = w.loss * static_cast<double>(w.samples);
      w.loss = w.loss + loss * static_cast<double>(batch);
    }
    w.samples += batch;
    ++w.micro_batches;
  }

  WindowInputs in_;
  dist::DataParallel* ddp_;
  plugin::NormWindow* norm_window_;
  bool sync_every_;
  bool keep_ = false;
  std::vector<std::pair<at::Tensor, at::Tensor>> kept_;  // the window's inputs and targets
};

}  // namespace

std::unique_ptr<WindowPass> eager_window(const WindowInputs& in, dist::DataParallel* ddp,
                                         plugin::NormWindow* norm_window,
                                         bool sync_every_micro_step) {
  return std::make_unique<EagerWindow>(in, ddp, norm_window, sync_every_micro_step);
}

}  // namespace kiln::engine
