#include "io/metrics.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>

namespace kiln::io {
namespace {

// JSON has no NaN/Infinity; write null so readers do not choke on a diverged run.
std::string num(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

// A step line, appended to a kept buffer without temporaries: a record is written every step.
class Line {
 public:
  explicit Line(std::string& buffer) : s_(buffer) { s_.clear(); }
  void number(double v) {
    if (std::isfinite(v)) {
      fmt::format_to(std::back_inserter(s_), "{}", v);
    } else {
      s_ += "null";
    }
  }
  void integer(int64_t v) { fmt::format_to(std::back_inserter(s_), "{}", v); }
  // `,"key":` (the first field has no comma).
  Line& key(const char* name) {
    s_ += s_.size() > 1 ? ",\"" : "\"";
    s_ += name;
    s_ += "\":";
    return *this;
  }
  Line& field(const char* name, double v) {
    key(name).number(v);
    return *this;
  }
  Line& field(const char* name, int64_t v) {
    key(name).integer(v);
    return *this;
  }
  Line& field(const char* name, bool v) {
    key(name);
    s_ += v ? "true" : "false";
    return *this;
  }
  std::string& text() { return s_; }

 private:
  std::string& s_;
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
  line.text() += "{";
  line.key("type").text() += "\"step\"";
  line.field("step", r.step).field("epoch", r.epoch).field("loss", r.loss);
  line.key("lr").text() += "[";
  for (size_t i = 0; i < r.lr.size(); ++i) {
    if (i > 0) line.text() += ",";
    line.number(r.lr[i]);
  }
  line.text() += "]";
  line.field("started", r.started)
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
      .field("allreduces", r.allreduces);
  line.text() += "}\n";
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
