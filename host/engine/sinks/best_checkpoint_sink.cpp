#include <spdlog/spdlog.h>

#include <cmath>

#include "engine/checkpointer.hpp"
#include "engine/sinks/sinks.hpp"

namespace kiln::engine {

namespace {

class BestCheckpointSink final : public RunSink {
 public:
  BestCheckpointSink(Checkpointer& checkpointer, std::string metric, double best,
                     const RunPosition& start)
      : checkpointer_(checkpointer), metric_(std::move(metric)), best_(best), at_(start) {}

  void step(const StepReport& r) override { at_ = r.position; }
  // The epoch's checkpoint is of the next epoch's start: the same state, the same folder.
  void epoch_end(const RunPosition& next) override { at_ = next; }

  void eval(const io::EvalRecord& r) override {
    const double value = metric_ == "loss"   ? r.loss
                         : metric_ == "top5" ? r.accuracy_top5
                                             : r.accuracy;
    // Nothing trained yet (no checkpoint to keep), or nothing to compare.
    if (at_.step == 0 || r.step != at_.step || std::isnan(value)) return;
    const bool better = std::isnan(best_) || (metric_ == "loss" ? value < best_ : value > best_);
    if (!better) return;
    best_ = value;
    checkpointer_.keep_best(at_, metric_, value);
  }

 private:
  Checkpointer& checkpointer_;
  std::string metric_;
  double best_;
  RunPosition at_;
};

}  // namespace

std::unique_ptr<RunSink> best_checkpoint_sink(Checkpointer& checkpointer, const std::string& metric,
                                              double best, const RunPosition& start) {
  return std::make_unique<BestCheckpointSink>(checkpointer, metric, best, start);
}

}  // namespace kiln::engine
