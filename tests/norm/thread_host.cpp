#include "thread_host.hpp"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>

#include "kiln/torch.hpp"

namespace kiln::norm_test {

ThreadGroup::ThreadGroup(int32_t world)
    : world_(world), slots_(world), allgathers_(world, 0), allreduces_(world, 0) {}

void ThreadGroup::reset_counts() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::fill(allgathers_.begin(), allgathers_.end(), 0);
  std::fill(allreduces_.begin(), allreduces_.end(), 0);
}

int ThreadGroup::allgathers(int32_t rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allgathers_[rank];
}

int ThreadGroup::allreduces(int32_t rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allreduces_[rank];
}

void ThreadGroup::barrier() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t generation = generation_;
  if (++arrived_ == world_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return generation_ != generation; })) {
    throw std::runtime_error("collective timed out: not every rank joined");
  }
}

void ThreadGroup::publish(int32_t rank, const at::Tensor& t) {
  at::Tensor copy = t.detach().to(at::kCPU).contiguous().reshape({-1}).clone();
  std::lock_guard<std::mutex> lock(mutex_);
  slots_[rank] = copy;
}

void ThreadGroup::allgather(int32_t rank, const at::Tensor& in, const at::Tensor& out) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++allgathers_[rank];
  }
  publish(rank, in);
  barrier();  // every slot written; nobody writes again before the second barrier
  at::Tensor all = at::cat(slots_);
  barrier();
  out.copy_(all.view(out.sizes()));
}

void ThreadGroup::allreduce(int32_t rank, const at::Tensor& inout, int32_t op) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++allreduces_[rank];
  }
  publish(rank, inout);
  barrier();
  at::Tensor stacked = at::stack(slots_);
  barrier();
  at::Tensor r = op == KILN_REDUCE_SUM   ? stacked.sum(0)
                 : op == KILN_REDUCE_MAX ? std::get<0>(stacked.max(0))
                                         : std::get<0>(stacked.min(0));
  inout.copy_(r.view(inout.sizes()));
}

void ThreadGroup::broadcast(int32_t rank, const at::Tensor& inout, int32_t root) {
  publish(rank, inout);
  barrier();
  at::Tensor source = slots_[root];
  barrier();
  inout.copy_(source.view(inout.sizes()));
}

namespace {

int32_t rank_of(kiln_call_context* ctx) { return ctx != nullptr ? ctx->rank : 0; }
int32_t world_of(kiln_call_context* ctx) {
  return ctx != nullptr && ctx->group != nullptr ? ctx->group->world() : 1;
}

template <typename Body>
kiln_status* guarded(const char* what, Body&& body) {
  try {
    body();
    return nullptr;
  } catch (const std::exception& e) {
    return test::make_status(KILN_ERR_INTERNAL, (std::string(what) + ": " + e.what()).c_str());
  }
}

kiln_status* allreduce(kiln_call_context* ctx, DLTensor* inout, int32_t op) {
  return guarded("allreduce", [&] {
    if (ctx != nullptr && ctx->group != nullptr) {
      ctx->group->allreduce(ctx->rank, kiln::as_tensor(*inout), op);
    }
  });
}

kiln_status* broadcast(kiln_call_context* ctx, DLTensor* inout, int32_t root) {
  return guarded("broadcast", [&] {
    if (ctx != nullptr && ctx->group != nullptr) {
      ctx->group->broadcast(ctx->rank, kiln::as_tensor(*inout), root);
    }
  });
}

kiln_status* allgather(kiln_call_context* ctx, const DLTensor* in, DLTensor* out) {
  return guarded("allgather", [&] {
    at::Tensor src = kiln::as_tensor(*in), dst = kiln::as_tensor(*out);
    if (dst.numel() != src.numel() * world_of(ctx)) {
      throw std::runtime_error("output has " + std::to_string(dst.numel()) + " elements");
    }
    if (ctx != nullptr && ctx->group != nullptr) {
      ctx->group->allgather(ctx->rank, src, dst);
    } else {
      dst.copy_(src.reshape(dst.sizes()));
    }
  });
}

void* no_stream(DLDevice) { return nullptr; }

}  // namespace

const kiln_host_api* thread_host() {
  static const kiln_host_api api = [] {
    kiln_host_api a = test::status_only_host();
    a.current_stream = no_stream;
    a.rank = rank_of;
    a.world_size = world_of;
    a.allreduce = allreduce;
    a.broadcast = broadcast;
    a.allgather = allgather;
    return a;
  }();
  return &api;
}

void run_ranks(ThreadGroup& group, const std::function<void(int32_t, kiln_call_context*)>& fn) {
  std::vector<std::exception_ptr> errors(group.world());
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < group.world(); ++r) {
    threads.emplace_back([&, r] {
      at::set_num_threads(1);  // ranks are the parallelism; 2 shared cores
      kiln_call_context ctx{&group, r};
      try {
        fn(r, &ctx);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace kiln::norm_test
