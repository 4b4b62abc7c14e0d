// Data parallelism on c10d's Reducer, the engine under torch.nn.parallel.DistributedDataParallel:
// gradients are grouped into buckets that are all-reduced (averaged) during backward as they
// fill; parameters and buffers start from rank 0's; accumulation micro-steps skip the
// all-reduce the way DDP's no_sync() does.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Reducer;
}

namespace kiln::dist {

class ProcessGroup;

struct DataParallelOptions {
  double bucket_cap_mb = 25.0;          // bucket size (the first is 1 MiB at 25, as DDP's)
  bool find_unused_parameters = false;  // walk the graph for parameters that got no gradient
  bool broadcast_buffers = true;        // rank 0's buffers (BN statistics) at each window start
  std::string compression = "none";     // "none", "fp16" or "bf16" on the wire
  // Gradients alias the buckets: no copy back after the all-reduce and no second gradient-sized
  // buffer. DDP defaults to false for Python code that detaches or resizes .grad; nothing in Kiln
  // does, and the copy cost `kiln launch --nproc 1` ~10 % of a CPU ResNet-50 step.
  bool gradient_as_bucket_view = true;
};

class DataParallel {
 public:
  // `params`: the trainable parameters in model order; `buffers`: the model's buffers.
  // Broadcasts both from rank 0 (collective: every rank must construct it).
  DataParallel(ProcessGroup& group, std::vector<at::Tensor> params, std::vector<at::Tensor> buffers,
               const DataParallelOptions& options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Before each forward: rebuilds buckets in gradient-ready order after the first step (as DDP
  // does) and, at a window's first micro-step, takes rank 0's buffers. `sync`: this micro-step's
  // backward will all-reduce.
  void before_forward(bool window_start, bool sync);
  // Between forward and backward: `sync` arms the Reducer so this backward all-reduces; without
  // it the gradients only accumulate locally. `loss` lets find_unused_parameters walk the graph.
  void before_backward(bool sync, const at::Tensor& loss);

  // Gradient all-reduces issued so far (buckets, plus the unused-parameter map when enabled).
  int64_t allreduce_calls() const;

 private:
  ProcessGroup& group_;
  DataParallelOptions options_;
  std::vector<at::Tensor> buffers_;
  std::unique_ptr<c10d::Reducer> reducer_;
};

}  // namespace kiln::dist
