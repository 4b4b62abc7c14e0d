#include <spdlog/spdlog.h>

#include "engine/sinks/sinks.hpp"
#include "io/progress.hpp"
#include "io/status_line.hpp"

namespace kiln::engine {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class ProgressSink final : public RunSink {
 public:
  explicit ProgressSink(const ProgressFrame& frame) : frame_(frame), window_start_(frame.start) {}

  void step(const StepReport& r) override {
    window_loss_ += r.loss_sum;
    window_samples_ += r.samples;
    io::ProgressState s;
    s.epoch = r.record.epoch;
    s.epochs = frame_.epochs;
    s.step = r.record.step;
    s.total_steps = frame_.max_steps;
    s.loss = window_loss_ / window_samples_;
    s.lr = r.record.lr[0];
    s.samples_per_s = window_samples_ / seconds_since(window_start_);
    s.elapsed = seconds_since(frame_.start);
    s.first_step = frame_.first_step;
    if (r.logged) {
      spdlog::info("{}", io::format_progress(s));
      window_loss_ = window_samples_ = 0.0;
      window_start_ = Clock::now();
    }
    // Not after the epoch's or the run's last step, whose end clears the bar at once.
    if (frame_.bar && !r.last_of_epoch && !r.last_of_run) draw(s);
  }

  void epoch_end(const RunPosition& /*next*/) override { clear(); }
  void run_end() override { clear(); }

 private:
  // Redrawn ten times a second at most, and at once after a log line cleared it: each redraw
  // writes to the terminal, a system call (docs/speed.md), and a small model's step is much
  // shorter.
  void draw(const io::ProgressState& s) {
    const auto now = Clock::now();
    io::StatusLine& line = *frame_.bar;
    if (!line.shown() || now - drawn_at_ >= std::chrono::milliseconds(100)) {
      line.draw(io::format_progress_bar(s, io::terminal_width() - 1));
      drawn_at_ = now;
    }
  }
  // The run's end and the caller's lines after it start on a clean line. (Log lines erase the
  // bar themselves: io/log.)
  void clear() {
    if (frame_.bar) frame_.bar->clear();
  }

  ProgressFrame frame_;
  double window_loss_ = 0.0, window_samples_ = 0.0;
  Clock::time_point window_start_;
  Clock::time_point drawn_at_;
};

}  // namespace

std::unique_ptr<RunSink> progress_sink(const ProgressFrame& frame) {
  return std::make_unique<ProgressSink>(frame);
}

}  // namespace kiln::engine
