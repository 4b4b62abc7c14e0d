#include "report.hpp"

#include <string>

namespace kiln::norm {

kiln_norm_batch_stats* report_request(const kiln_norm_forward_args* args, const char* plugin) {
  if (!KILN_HAS_FIELD(args, kiln_norm_forward_args, batch_stats)) return nullptr;
  kiln_norm_batch_stats* report = args->batch_stats;
  if (report == nullptr) return nullptr;
  if (!KILN_HAS_FIELD(report, kiln_norm_batch_stats, reported) || report->mean == nullptr ||
      report->var == nullptr) {
    throw Error(KILN_ERR_INVALID_ARGUMENT,
                std::string(plugin) + ": batch_stats lacks mean, var or room for the count " +
                    "(struct_size " + std::to_string(report->struct_size) + ")");
  }
  return report;
}

void report_stats(kiln_norm_batch_stats* report, double count, const at::Tensor& mean,
                  const at::Tensor& unbiased_var, double momentum) {
  kiln::as_tensor(*report->mean).copy_(mean);
  kiln::as_tensor(*report->var).copy_(unbiased_var);
  finish_report(report, count, momentum);
}

ReportAsRunning running_stats_for_report(kiln_norm_batch_stats* report) {
  ReportAsRunning out{kiln::as_tensor(*report->mean), kiln::as_tensor(*report->var)};
  out.mean.zero_();
  out.var.zero_();
  return out;
}

void finish_report(kiln_norm_batch_stats* report, double count, double momentum) {
  report->count = count;
  report->momentum = momentum;
  report->reported = 1;
}

double values_per_channel(const at::Tensor& x) {
  if (x.size(1) <= 0) return 0.0;
  const int64_t count_per_channel = x.numel() / x.size(1);  // exact: numel is a multiple of C
  return static_cast<double>(count_per_channel);
}

}  // namespace kiln::norm
