#include "io/metrics.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include "io/write_all.hpp"

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

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  // Read access too: appending first finds where the whole lines end.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (append ? 0 : O_TRUNC), 0644);
  if (fd_ < 0) throw file_error(path, "cannot open metrics file", errno);
  if (append) {
    try {
      const off_t keep = whole_lines_length(fd_, path);
      if (::ftruncate(fd_, keep) != 0 || ::lseek(fd_, keep, SEEK_SET) < 0) {
        throw file_error(path, "cannot append to metrics file", errno);
      }
    } catch (...) {
      ::close(fd_);  // the destructor does not run for a throwing constructor
      throw;
    }
  }
  last_flush_ = std::chrono::steady_clock::now();
}

MetricsWriter::~MetricsWriter() {
  if (fd_ < 0) return;
  try {
    flush();
  } catch (const std::exception& e) {
    spdlog::warn("{}", e.what());
  }
  ::close(fd_);
}

void MetricsWriter::flush() {
  if (fd_ < 0) return;
  const size_t written = write_all(fd_, pending_.data(), pending_.size());
  if (written < pending_.size()) {
    const int error = errno;
    // Keep what did not go out, so a later flush retries it.
    const size_t rest = pending_.size() - written;
    std::memmove(pending_.data(), pending_.data() + written, rest);
    pending_.resize(rest);
    throw file_error(path_, "cannot write metrics", error);
  }
  pending_.clear();
  last_flush_ = std::chrono::steady_clock::now();
}

void MetricsWriter::flush_if_due() {
  if (pending_.size() >= kFlushBytes ||
      std::chrono::steady_clock::now() - last_flush_ >= kFlushAge) {
    flush();
  }
}

void MetricsWriter::write(const StepRecord& r) {
  if (!enabled()) return;
  Line line(pending_);
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
  flush_if_due();
}

void MetricsWriter::write(const EvalRecord& r) {
  if (!enabled()) return;
  fmt::format_to(fmt::appender(pending_),
                 "{{\"type\":\"eval\",\"epoch\":{},\"step\":{},\"accuracy\":{},\"loss\":{}}}\n",
                 r.epoch, r.step, num(r.accuracy), num(r.loss));
  flush();
}

}  // namespace kiln::io
