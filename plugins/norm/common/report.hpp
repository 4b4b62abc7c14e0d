// Reporting a training forward's batch statistics to a host that updates the running statistics
// itself (ABI 1.5, kiln_norm_forward_args.batch_stats), instead of updating them here.
#pragma once

#include <ATen/core/Tensor.h>

#include "kiln/torch.hpp"

namespace kiln::norm {

// The host's request for a report, or nullptr when the plugin updates the running statistics
// itself (no request, or arguments from a host older than 1.5, which lack the field). Throws
// (messages start with `plugin`) when the request lacks its tensors.
kiln_norm_batch_stats* report_request(const kiln_norm_forward_args* args, const char* plugin);

// Fills `report`: the batch mean and unbiased variance (any floating dtype, [C]) of `count`
// values per channel, and the plugin's momentum.
void report_stats(kiln_norm_batch_stats* report, double count, const at::Tensor& mean,
                  const at::Tensor& unbiased_var, double momentum);

// ATen's native_batch_norm updates running statistics as r = momentum·s + (1 − momentum)·r with
// the unbiased variance. Given the report's tensors, zeroed, as running statistics and a
// momentum of 1, it writes exactly the batch mean and unbiased variance into them, at no extra
// pass over the data. These return those tensors (zeroed), then mark the report filled.
struct ReportAsRunning {
  at::Tensor mean, var;
};
ReportAsRunning running_stats_for_report(kiln_norm_batch_stats* report);
void finish_report(kiln_norm_batch_stats* report, double count, double momentum);

// Values per channel of an N x C x ... input.
double values_per_channel(const at::Tensor& x);

}  // namespace kiln::norm
