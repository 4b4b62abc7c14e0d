#include "dist/data_parallel.hpp"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "dist/compress_hook.hpp"
#include "dist/process_group.hpp"

namespace kiln::dist {
namespace {

// DDP's first rebuilt bucket at the default cap (dist._DEFAULT_FIRST_BUCKET_BYTES).
constexpr int64_t kFirstBucketBytes = 1024 * 1024;
// Chunk size of the start-up broadcast, as DDP's.
constexpr size_t kBroadcastBytes = 250 * 1024 * 1024;

}  // namespace

DataParallel::DataParallel(ProcessGroup& group, std::vector<at::Tensor> params,
                           std::vector<at::Tensor> buffers, const DataParallelOptions& options)
    : group_(group), options_(options), buffers_(std::move(buffers)) {
  if (params.empty()) throw std::invalid_argument("data parallel training needs parameters");
  const auto& pg = group_.counted_group();
  {
    // Every rank starts from rank 0's weights and buffers.
    std::vector<at::Tensor> state = params;
    state.insert(state.end(), buffers_.begin(), buffers_.end());
    at::NoGradGuard no_grad;
    c10d::broadcast_coalesced(pg, state, kBroadcastBytes, 0);
  }
  // PyTorch DDP's bucketing: the first step runs with one bucket (the order gradients arrive in
  // is unknown until then; with find_unused_parameters, size-capped buckets), then the Reducer
  // rebuilds them in arrival order with a small first bucket (1 MiB at the default cap, so the
  // first all-reduce starts early) and bucket_cap_mb after.
  const auto cap = static_cast<int64_t>(options.bucket_cap_mb * 1024 * 1024);
  const bool default_cap = options.bucket_cap_mb == 25.0;
  const int64_t first_cap = default_cap ? kFirstBucketBytes : cap;
  std::vector<size_t> limits_in = {std::numeric_limits<size_t>::max()};
  if (options.find_unused_parameters) {
    limits_in = default_cap
                    ? std::vector<size_t>{static_cast<size_t>(first_cap), static_cast<size_t>(cap)}
                    : std::vector<size_t>{static_cast<size_t>(cap)};
  }
  auto [indices, limits] = c10d::compute_bucket_assignment_by_size(params, limits_in);
  // Buckets in reverse model order: gradients become ready roughly back to front.
  std::reverse(indices.begin(), indices.end());
  reducer_ = std::make_unique<c10d::Reducer>(
      params, std::move(indices), pg, std::vector<bool>(params.size(), false), cap,
      options.find_unused_parameters, options.gradient_as_bucket_view,
      std::unordered_map<size_t, std::string>{}, first_cap,
      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
      /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
  if (options.compression == "fp16") {
    reducer_->register_comm_hook(std::make_unique<CompressHook>(pg, at::kHalf));
  } else if (options.compression == "bf16") {
    reducer_->register_comm_hook(std::make_unique<CompressHook>(pg, at::kBFloat16));
  } else if (options.compression != "none") {
    throw std::invalid_argument("unknown gradient compression '" + options.compression +
                                "' (none, fp16 or bf16)");
  }
}

DataParallel::~DataParallel() = default;

void DataParallel::before_forward(bool window_start, bool sync) {
  // After the first synced backward the Reducer knows the order gradients arrive in and
  // rebuilds its buckets to match (a no-op otherwise), before the forward's memory peak.
  if (sync) reducer_->prepare_for_forward();
  reducer_->rebuild_buckets();
  if (window_start && options_.broadcast_buffers && !buffers_.empty()) {
    at::NoGradGuard no_grad;
    c10d::broadcast_coalesced(group_.counted_group(), buffers_, kBroadcastBytes, 0);
  }
}

void DataParallel::before_backward(bool sync, const at::Tensor& loss) {
  if (!sync) return;  // no_sync: gradients accumulate locally, the hooks stay unarmed
  reducer_->prepare_for_backward(options_.find_unused_parameters ? std::vector<at::Tensor>{loss}
                                                                 : std::vector<at::Tensor>{});
}

int64_t DataParallel::allreduce_calls() const { return group_.counted_allreduces(); }

}  // namespace kiln::dist
