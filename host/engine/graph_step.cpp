#include "engine/graph_step.hpp"

#include <ATen/autocast_mode.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/full.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <spdlog/spdlog.h>

#include <stdexcept>
#include <utility>

#include "engine/loss.hpp"

namespace kiln::engine {

std::string graph_unsupported_reason(const GraphConditions& c) {
  if (!c.cuda) return "CUDA graphs need a CUDA device";
  if (c.world_size > 1) {
    return "a distributed run all-reduces gradients during backward, which the graph does not "
           "capture";
  }
  if (c.accumulation > 1) return "gradient accumulation (run.accumulation_steps > 1)";
  if (c.master_weights) return "master weights (precision o2) are gathered outside the graph";
  if (c.activation_checkpointing) {
    return "activation checkpointing (memory.checkpoint) recomputes with saved RNG states";
  }
  return "";
}

struct GraphedStep::Impl {
  kiln::Model& model;
  const Loss& loss_fn;
  std::vector<at::Tensor> params;
  PrecisionPlan plan;
  double norm_type;
  at::Device device;
  c10::cuda::CUDAStream stream;  // the graph's own stream: capture cannot use the default one
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  at::Tensor static_x, static_y;    // the graph's inputs: each batch is copied in
  at::Tensor scale;                 // 0-d float32: the loss scale, set before every step
  at::Tensor readout;               // the graph's output: [found_inf, norm, loss]
  at::cuda::CUDAEvent ready, done;  // orders the graph's stream after the caller's, and back
  Update update;                    // enqueued after the check in the capture only
  int eager_steps = 0;
  bool failed = false;  // a capture failed: eager from then on

  Impl(kiln::Model& m, const Loss& l, std::vector<at::Tensor> p, const PrecisionPlan& pl, double n,
       at::Device d)
      : model(m),
        loss_fn(l),
        params(std::move(p)),
        plan(pl),
        norm_type(n),
        device(d),
        stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index())) {}

  bool scaled() const { return plan.loss_scaling != KILN_SCALE_NONE; }

  // Enqueues forward, loss, backward and the check on the current stream; reads nothing back.
  at::Tensor enqueue(const at::Tensor& x, const at::Tensor& y) {
    at::Tensor loss;
    {
      AutocastScope autocast(device.type(), plan.autocast_dtype, plan.autocast);
      loss = loss_fn(model.forward(x), y);
    }
    (scaled() ? loss * scale : loss).backward();
    at::NoGradGuard no_grad;
    // The scale is a device tensor, so its changes reach the graph without a new capture.
    at::Tensor inv_scale = scaled() ? scale.reciprocal().reshape({1}) : at::Tensor();
    return launch_gradient_check(params, inv_scale, norm_type, loss.detach());
  }

  void drop_grads() {
    for (auto& p : params) p.mutable_grad() = at::Tensor();
  }

  // Captures one step on (x, y). The gradients are dropped first, so that backward allocates
  // them in the graph's memory pool, where every replay writes them again.
  void capture(const at::Tensor& x, const at::Tensor& y) {
    static_x = x.clone();
    static_y = y.clone();
    drop_grads();
    c10::cuda::device_synchronize();
    graph = std::make_unique<at::cuda::CUDAGraph>();
    // A pool of our own, so that a failed capture can take the allocators off it (below).
    const at::cuda::MempoolId_t pool = at::cuda::graph_pool_handle();
    const c10::DeviceIndex pool_device = c10::cuda::current_device();
    // Casts autocast caches would be made inside the capture and freed after it.
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    try {
      // Thread-local mode: only this thread is held to capture's rules. In global mode a
      // CUDA call from any other thread during the capture (a loader worker's pinned batch
      // buffer: cudaHostAlloc, cudaEventQuery) would invalidate it and fail in that thread.
      graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
      readout = enqueue(static_x, static_y);
      if (update) update(readout);
      graph->capture_end();
    } catch (...) {
      at::autocast::set_autocast_cache_enabled(cache);
      // The clean-up calls below throw where torch already did their work: nothing to undo.
      const auto quietly = [](auto&& call) {
        try {
          call();
        } catch (...) {
        }
      };
      quietly([&] { graph->capture_end(); });  // ends an invalidated capture, throwing
      // capture_end() throws at an invalidated capture before it takes the device and host
      // allocators off the graph's pool (torch 2.11's CUDAGraph.cpp), and they would go on
      // sending this stream's allocations there, through a filter that points at the deleted
      // graph.
      bool ended = true;
      try {
        (void)graph->pool();  // throws unless the capture ended
      } catch (...) {
        ended = false;
      }
      if (!ended) {
        quietly([&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(pool_device, pool); });
        quietly([&] { at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool); });
      }
      graph.reset();  // releases the pool of a capture that ended
      readout = at::Tensor();
      drop_grads();
      if (!ended) {
        // What the capture allocated is dropped above; the pool's blocks go back to the cache.
        quietly([&] { c10::cuda::CUDACachingAllocator::releasePool(pool_device, pool); });
        quietly([&] { at::getHostAllocator(at::kCUDA)->release_pool(pool); });
      }
      (void)cudaGetLastError();  // the failed capture's error is not sticky: clear it
      throw;
    }
    at::autocast::set_autocast_cache_enabled(cache);
  }

  bool matches_graph(const at::Tensor& x, const at::Tensor& y) const {
    return graph && x.sizes() == static_x.sizes() && x.strides() == static_x.strides() &&
           x.scalar_type() == static_x.scalar_type() && y.sizes() == static_y.sizes() &&
           y.scalar_type() == static_y.scalar_type();
  }

  // The step's readout, and whether it came from a replay.
  std::pair<at::Tensor, bool> step(const at::Tensor& x, const at::Tensor& y, bool may_capture) {
    if (!graph && !failed && eager_steps >= kWarmupSteps && may_capture) {
      try {
        capture(x, y);
        spdlog::info(
            "run.cuda_graph: step captured for batches of {} samples; replayed from now on",
            x.size(0));
      } catch (const std::exception& e) {
        failed = true;
        spdlog::warn("run.cuda_graph: the step could not be captured ({}); it runs eagerly",
                     e.what());
      }
    }
    if (matches_graph(x, y)) {
      static_x.copy_(x, /*non_blocking=*/true);
      static_y.copy_(y, /*non_blocking=*/true);
      graph->replay();
      return {readout, true};
    }
    // Eager: before a capture the gradients start from none, as zero_grad leaves them; after it
    // they are the graph's buffers, zeroed in place so that the replays keep writing them.
    if (graph) {
      at::NoGradGuard no_grad;
      for (auto& p : params) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
    } else {
      drop_grads();
    }
    ++eager_steps;
    return {enqueue(x, y), false};
  }
};

namespace {

// `device`, checked before anything asks CUDA for a stream.
at::Device cuda_device(at::Device device) {
  if (!device.is_cuda()) throw std::invalid_argument("GraphedStep needs a CUDA device");
  return device;
}

}  // namespace

GraphedStep::GraphedStep(kiln::Model& model, const Loss& loss, std::vector<at::Tensor> params,
                         const PrecisionPlan& plan, double norm_type, at::Device device)
    : impl_(std::make_unique<Impl>(model, loss, std::move(params), plan, norm_type,
                                   cuda_device(device))) {
  c10::cuda::CUDAStreamGuard guard(impl_->stream);
  impl_->scale = at::full({}, 1.0, at::TensorOptions().dtype(at::kFloat).device(device));
}

GraphedStep::~GraphedStep() = default;

bool GraphedStep::captured() const { return impl_->graph != nullptr; }

void GraphedStep::set_update(Update update) {
  if (impl_->graph) throw std::logic_error("GraphedStep::set_update after the capture");
  impl_->update = std::move(update);
}

GraphedStep::Result GraphedStep::run(const at::Tensor& x, const at::Tensor& y, double scale,
                                     bool may_capture) {
  Impl& s = *impl_;
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(s.device.index());
  // The graph's stream starts after what the caller's stream queued: the batch's copy, the
  // last optimizer step.
  s.ready.record(caller);
  s.ready.block(s.stream);
  Result result;
  {
    c10::cuda::CUDAStreamGuard guard(s.stream);
    s.scale.fill_(scale);
    auto [readout, replayed] = s.step(x, y, may_capture);
    result.check = read_gradient_check(readout);  // the step's one wait on the device
    result.updated = replayed && s.update != nullptr;
  }
  // And the caller's stream (the optimizer, the evaluation) continues after the graph's.
  s.done.record(s.stream);
  s.done.block(caller);
  return result;
}

}  // namespace kiln::engine
