#include "group.hpp"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <string>

#include "options.hpp"

namespace kiln::norm {
namespace {

// Turns a status from a host collective into an exception carrying its code and message.
void check_host(const kiln_host_api* host, kiln_status* status, const char* plugin,
                const char* what) {
  if (status == nullptr) return;
  Error error(host->status_code(status),
              std::string(plugin) + ": " + what + " failed: " + host->status_message(status));
  host->free_status(status);
  throw error;
}

}  // namespace

StatsGroup::StatsGroup(const kiln_host_api* host, kiln_call_context* ctx, int64_t group_size,
                       const char* plugin)
    : host_(host), ctx_(ctx), plugin_(plugin) {
  world_ = host->world_size != nullptr ? host->world_size(ctx) : 1;
  rank_ = host->rank != nullptr ? host->rank(ctx) : 0;
  if (world_ < 1) world_ = 1;
  check_group_size(group_size, world_, plugin);
  const int64_t k = group_size == 0 ? world_ : group_size;
  size_ = static_cast<int32_t>(k);
  first_ = rank_ / size_ * size_;
}

at::Tensor StatsGroup::gather(const at::Tensor& packed) const {
  at::Tensor in = packed.contiguous();
  if (world_ == 1) return in.unsqueeze(0);
  at::Tensor out = at::empty({world_, in.numel()}, in.options());
  DLTensor in_dl = kiln::as_dltensor(in), out_dl = kiln::as_dltensor(out);
  check_host(host_, host_->allgather(ctx_, &in_dl, &out_dl), plugin_, "allgather");
  return out.narrow(0, first_, size_);
}

at::Tensor StatsGroup::sum(const at::Tensor& packed) const {
  if (size_ == 1) return packed;
  if (size_ < world_) return gather(packed).sum(0);
  // The whole world is the group: one allreduce moves O(L) per rank instead of O(world * L).
  at::Tensor inout = packed.contiguous().clone();
  DLTensor dl = kiln::as_dltensor(inout);
  check_host(host_, host_->allreduce(ctx_, &dl, KILN_REDUCE_SUM), plugin_, "allreduce");
  return inout;
}

Moments group_moments(const StatsGroup& group, const at::Tensor& x) {
  Moments local = local_moments(x);
  if (group.alone()) return local;
  return combine(group.gather(pack(local)));
}

GradSums group_grad_sums(const StatsGroup& group, double local_count, const at::Tensor& a,
                         const at::Tensor& b) {
  if (group.alone()) return GradSums{local_count, a, b};
  const int64_t channels = a.numel();
  at::Tensor packed = at::cat({at::full({1}, local_count, a.options()), a, b});
  at::Tensor total = group.sum(packed);
  return GradSums{total[0].item<double>(), total.narrow(0, 1, channels),
                  total.narrow(0, 1 + channels, channels)};
}

}  // namespace kiln::norm
