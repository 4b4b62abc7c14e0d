#include <cmath>

#include "engine/sinks/sinks.hpp"
#include "io/tensorboard.hpp"

namespace kiln::engine {

namespace {

class TensorBoardSink final : public RunSink {
 public:
  TensorBoardSink(const std::string& dir, int64_t resumed_at, std::vector<std::string> groups)
      : writer_(dir), groups_(std::move(groups)) {
    // What the interrupted run logged after its checkpoint is redone here: TensorBoard drops it.
    if (resumed_at > 0) writer_.session_start(resumed_at + 1);
  }

  void step(const StepReport& r) override {
    const io::StepRecord& s = r.record;
    writer_.scalar("train/loss", s.loss, s.step);
    for (size_t g = 0; g < groups_.size(); ++g) writer_.scalar("lr/" + groups_[g], s.lr[g], s.step);
    writer_.scalar("train/loss_scale", s.loss_scale, s.step);
    if (r.outcome.check.measured) writer_.scalar("train/grad_norm", s.grad_norm, s.step);
    writer_.scalar("train/skipped_steps", static_cast<double>(s.skipped_total), s.step);
    writer_.scalar("perf/samples_per_s", s.samples_per_s, s.step);
    writer_.scalar("perf/data_time", s.data_time, s.step);
    if (std::isfinite(s.memory_mb)) writer_.scalar("perf/memory_mb", s.memory_mb, s.step);
  }

  void eval(const io::EvalRecord& e) override {
    if (!e.multi_label) {
      writer_.scalar("eval/accuracy", e.accuracy, e.step);
      writer_.scalar("eval/top5", e.accuracy_top5, e.step);
    } else {
      writer_.scalar("eval/map", e.map, e.step);
    }
    writer_.scalar("eval/loss", e.loss, e.step);
  }

  void flush() override { writer_.flush(); }

 private:
  io::TensorBoardWriter writer_;
  std::vector<std::string> groups_;
};

}  // namespace

std::unique_ptr<RunSink> tensorboard_sink(const std::string& dir, int64_t resumed_at,
                                          const std::vector<std::string>& group_names) {
  return std::make_unique<TensorBoardSink>(dir, resumed_at, group_names);
}

}  // namespace kiln::engine
