#include "io/metrics.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "io/buffered_file.hpp"

namespace kiln::io {
namespace {

// Past either bound the buffered lines go to the OS: about 150 step lines, or a second, so a
// reader following the file (tail -f, a notebook) is at most a second behind.
constexpr size_t kFlushBytes = 64 * 1024;
constexpr auto kFlushAge = std::chrono::seconds(1);

std::runtime_error file_error(const std::string& path, const char* what, int error) {
  return std::runtime_error(path + ": " + what + ": " + std::strerror(error));
}

// The length of `fd`'s content up to and including its last newline: a line a killed writer
// left half-written is not a record, and appending after it would corrupt the next one too.
off_t whole_lines_length(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw file_error(path, "cannot read metrics file", errno);
  char chunk[4096];
  for (off_t end = st.st_size; end > 0;) {
    const off_t begin = end > static_cast<off_t>(sizeof chunk) ? end - sizeof chunk : 0;
    const ssize_t n = ::pread(fd, chunk, static_cast<size_t>(end - begin), begin);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw file_error(path, "cannot read metrics file", n < 0 ? errno : EIO);
    for (ssize_t i = n; i > 0; --i) {
      if (chunk[i - 1] == '\n') return begin + i;
    }
    end = begin;
  }
  return 0;
}

// JSON has no NaN/Infinity; write null so readers do not choke on a diverged run.
std::string num(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

// A step line, written into a kept buffer without temporaries: a record is written every step.
class Line {
 public:
  // Appends to `buffer` (the lines before it stay).
  explicit Line(fmt::memory_buffer& buffer) : b_(buffer), start_(buffer.size()) {}
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
    text(b_.size() > start_ + 1 ? ",\"" : "\"").text(name).text("\":");
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
  size_t start_;  // where this line begins in b_
};

}  // namespace

void MetricsWriter::set_lr_groups(const std::vector<std::string>& names) {
  // Group names come from regular expressions: quotes and backslashes are common.
  lr_groups_ = nlohmann::json(names).dump();
}

MetricsWriter::MetricsWriter(const std::string& path, bool append) {
  if (path.empty()) return;
  // Read access too: appending first finds where the whole lines end.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (append ? 0 : O_TRUNC), 0644);
  if (fd < 0) throw file_error(path, "cannot open metrics file", errno);
  file_.attach(fd, path, "metrics", kFlushAge, kFlushBytes);
  if (append) {
    const off_t keep = whole_lines_length(fd, path);
    if (::ftruncate(fd, keep) != 0 || ::lseek(fd, keep, SEEK_SET) < 0) {
      throw file_error(path, "cannot append to metrics file", errno);
    }
  }
}

void MetricsWriter::flush() { file_.flush(); }

void MetricsWriter::write(const StepRecord& r) {
  if (!enabled()) return;
  Line line(file_.buffer());
  line.text("{").key("type").text("\"step\"");
  line.field("step", r.step).field("epoch", r.epoch).field("loss", r.loss);
  line.key("lr").text("[");
  for (size_t i = 0; i < r.lr.size(); ++i) {
    if (i > 0) line.text(",");
    line.number(r.lr[i]);
  }
  line.text("]");
  if (!lr_groups_.empty()) line.key("lr_groups").text(lr_groups_);
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
  // Only an optimizer that re-evaluates adds passes: the lines of other runs stay as they were.
  if (r.reevaluations != 0) line.field("reevaluations", r.reevaluations);
  line.text("}\n");
  file_.flush_if_due();
}

void MetricsWriter::write(const EvalRecord& r) {
  if (!enabled()) return;
  fmt::format_to(fmt::appender(file_.buffer()),
                 "{{\"type\":\"eval\",\"epoch\":{},\"step\":{},\"accuracy\":{},\"loss\":{},"
                 "\"top5\":{}",
                 r.epoch, r.step, num(r.accuracy), num(r.loss), num(r.accuracy_top5));
  // Only multi-label evaluations have one: the lines of other runs stay as they were.
  if (r.multi_label) fmt::format_to(fmt::appender(file_.buffer()), ",\"map\":{}", num(r.map));
  if (r.averaged) fmt::format_to(fmt::appender(file_.buffer()), ",\"weights\":\"ema\"");
  fmt::format_to(fmt::appender(file_.buffer()), "}}\n");
  file_.flush();
}

}  // namespace kiln::io
