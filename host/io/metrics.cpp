#include "io/metrics.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kiln::io {
namespace {

// JSON has no NaN/Infinity; write null so readers do not choke on a diverged run.
std::string num(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

// A step line, written into a kept buffer without temporaries: a record is written every step.
class Line {
 public:
  explicit Line(fmt::memory_buffer& buffer) : b_(buffer) { b_.clear(); }
  void number(double v) {
    if (std::isfinite(v)) {
      fmt::format_to(fmt::appender(b_), "{}", v);
    } else {
      text("null");
    }
  }
  void integer(int64_t v) { fmt::format_to(fmt::appender(b_), "{}", v); }
  Line& text(std::string_view s) {
    b_.append(s);
    return *this;
  }
  // `,"key":` (the first field has no comma).
  Line& key(std::string_view name) {
    text(b_.size() > 1 ? ",\"" : "\"").text(name).text("\":");
    return *this;
  }
  Line& field(std::string_view name, double v) {
    key(name).number(v);
    return *this;
  }
  Line& field(std::string_view name, int64_t v) {
    key(name).integer(v);
    return *this;
  }
  Line& field(std::string_view name, bool v) { return key(name).text(v ? "true" : "false"); }

 private:
  fmt::memory_buffer& b_;
};

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append) {
  if (path.empty()) return;
  out_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!out_) throw std::runtime_error(path + ": cannot open metrics file: " + std::strerror(errno));
}

void MetricsWriter::write(const StepRecord& r) {
  if (!enabled()) return;
  Line line(line_);
  line.text("{").key("type").text("\"step\"");
  line.field("step", r.step).field("epoch", r.epoch).field("loss", r.loss);
  line.key("lr").text("[");
  for (size_t i = 0; i < r.lr.size(); ++i) {
    if (i > 0) line.text(",");
    line.number(r.lr[i]);
  }
  line.text("]")
      .field("started", r.started)
      .field("step_time", r.step_time)
      .field("data_time", r.data_time)
      .field("samples_per_s", r.samples_per_s)
      .field("loss_scale", r.loss_scale)
      .field("grad_norm", r.grad_norm)
      .field("skipped", r.skipped)
      .field("skipped_total", r.skipped_total)
      .field("micro_batches", r.micro_batches)
      .field("memory_mb", r.memory_mb)
      .field("tensor_mb", r.tensor_mb)
      .field("tensor_peak_mb", r.tensor_peak_mb)
      .field("activation_mb", r.activation_mb)
      .field("allreduces", r.allreduces)
      .text("}\n");
  out_.write(line_.data(), static_cast<std::streamsize>(line_.size()));
}

void MetricsWriter::write(const EvalRecord& r) {
  if (!enabled()) return;
  out_ << fmt::format(
      "{{\"type\":\"eval\",\"epoch\":{},\"step\":{},\"accuracy\":{},\"loss\":{}}}\n", r.epoch,
      r.step, num(r.accuracy), num(r.loss));
  out_.flush();
}

}  // namespace kiln::io
