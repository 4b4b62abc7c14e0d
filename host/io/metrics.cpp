#include "io/metrics.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace kiln::io {
namespace {

// JSON has no NaN/Infinity; write null so readers do not choke on a diverged run.
std::string num(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append) {
  if (path.empty()) return;
  out_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!out_) throw std::runtime_error(path + ": cannot open metrics file: " + std::strerror(errno));
}

void MetricsWriter::write(const StepRecord& r) {
  if (!enabled()) return;
  std::string lr;
  for (size_t i = 0; i < r.lr.size(); ++i) lr += (i ? "," : "") + num(r.lr[i]);
  out_ << fmt::format(
      "{{\"type\":\"step\",\"step\":{},\"epoch\":{},\"loss\":{},\"lr\":[{}],\"started\":{},"
      "\"step_time\":{},"
      "\"data_time\":{},\"samples_per_s\":{},\"loss_scale\":{},\"grad_norm\":{},\"skipped\":{},"
      "\"skipped_total\":{},\"micro_batches\":{},\"memory_mb\":{},\"tensor_mb\":{},"
      "\"tensor_peak_mb\":{},\"activation_mb\":{},\"allreduces\":{}}}\n",
      r.step, r.epoch, num(r.loss), lr, num(r.started), num(r.step_time), num(r.data_time),
      num(r.samples_per_s), num(r.loss_scale), num(r.grad_norm), r.skipped ? "true" : "false",
      r.skipped_total, r.micro_batches, num(r.memory_mb), num(r.tensor_mb), num(r.tensor_peak_mb),
      num(r.activation_mb), r.allreduces);
}

void MetricsWriter::write(const EvalRecord& r) {
  if (!enabled()) return;
  out_ << fmt::format(
      "{{\"type\":\"eval\",\"epoch\":{},\"step\":{},\"accuracy\":{},\"loss\":{}}}\n", r.epoch,
      r.step, num(r.accuracy), num(r.loss));
  out_.flush();
}

}  // namespace kiln::io
