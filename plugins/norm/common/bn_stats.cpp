#include "bn_stats.hpp"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "report.hpp"

namespace kiln::norm {

bool uses_batch_stats(const BnOptions& o, int32_t training, const DLTensor* running_mean,
                      const DLTensor* running_var) {
  return training != 0 || !o.track_running_stats || running_mean == nullptr ||
         running_var == nullptr;
}

Applied forward_stats(const kiln_host_api* host, kiln_call_context* ctx, const BnOptions& o,
                      const kiln_norm_forward_args* args, const at::Tensor& x, bool sync,
                      const char* plugin) {
  at::Tensor running_mean, running_var;
  if (o.track_running_stats) {
    running_mean = optional_view(args->running_mean);
    running_var = optional_view(args->running_var);
  }
  if (!uses_batch_stats(o, args->training, args->running_mean, args->running_var)) {
    return Applied{running_mean.to(at::kDouble), (running_var.to(at::kDouble) + o.eps).rsqrt()};
  }
  Moments m;
  int32_t world = 1;
  if (sync && args->training != 0) {
    StatsGroup group(host, ctx, o.group_size, plugin);
    world = group.size();
    m = group_moments(group, x);
  } else {
    m = local_moments(x);
  }
  check_count(m, x, world, plugin);
  if (args->training != 0) {
    // A host that updates the running statistics itself gets the batch's instead.
    if (kiln_norm_batch_stats* report = report_request(args, plugin)) {
      report_stats(report, m.count, m.mean, m.m2 / (m.count - 1.0), o.momentum);
    } else {
      update_running(running_mean, running_var, m, o.momentum);
    }
  }
  return Applied{m.mean, (m.m2 / m.count + o.eps).rsqrt()};
}

void save_stats(const kiln_norm_forward_args* args, const Applied& applied) {
  if (args->save_mean != nullptr) kiln::as_tensor(*args->save_mean).copy_(applied.mean);
  if (args->save_invstd != nullptr) kiln::as_tensor(*args->save_invstd).copy_(applied.invstd);
}

GradSums backward_sums(const kiln_host_api* host, kiln_call_context* ctx, const BnOptions& o,
                       int32_t training, bool sync, double local_count, const at::Tensor& a,
                       const at::Tensor& b, const char* plugin) {
  if (!sync || training == 0) return GradSums{local_count, a, b};
  StatsGroup group(host, ctx, o.group_size, plugin);
  return group_grad_sums(group, local_count, a, b);
}

}  // namespace kiln::norm
