#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "engine/checkpointer.hpp"
#include "engine/sinks/sinks.hpp"

namespace kiln::engine {

namespace {

class BestCheckpointSink final : public RunSink {
 public:
  BestCheckpointSink(Checkpointer& checkpointer, BestCheckpointRule rule, const RunPosition& start,
                     std::atomic<bool>& stop_requested)
      : checkpointer_(checkpointer), rule_(std::move(rule)), at_(start), stop_(stop_requested) {
    // A run that stopped early stays stopped when resumed with the same patience.
    if (rule_.best && patience_reached()) {
      spdlog::info(
          "early stop: {} evaluation(s) since the best {} at step {} (best.toml); raise "
          "run.early_stop_patience to train on",
          rule_.best->since.size(), rule_.best->metric, rule_.best->step);
      stop_ = true;
    }
  }

  void step(const StepReport& r) override { at_ = r.position; }
  // The epoch's checkpoint is of the next epoch's start: the same state, the same folder.
  void epoch_end(const RunPosition& next) override { at_ = next; }

  void eval(const io::EvalRecord& r) override {
    const std::string& metric = rule_.metric;
    const double value = metric == "loss"   ? r.loss
                         : metric == "top5" ? r.accuracy_top5
                         : metric == "map"  ? r.map
                                            : r.accuracy;
    // Nothing trained yet (no checkpoint to keep), or nothing to compare.
    if (at_.step == 0 || r.step != at_.step || std::isnan(value)) return;
    std::optional<io::BestCheckpoint>& best = rule_.best;
    if (!best || (metric == "loss" ? value < best->value : value > best->value)) {
      best = io::BestCheckpoint{r.step, metric, value, {}};
      checkpointer_.keep_best(at_, *best);
      return;
    }
    // Not better; the best itself evaluated again (a resume at its step) or an evaluation
    // already counted (a resume at that step) counts once.
    if (r.step != best->step &&
        std::find(best->since.begin(), best->since.end(), r.step) == best->since.end()) {
      best->since.push_back(r.step);
      checkpointer_.note_best(*best);
    }
    if (patience_reached()) {
      spdlog::info(
          "early stop: {} evaluation(s) without a better {} than {:.6g} at step {} "
          "(run.early_stop_patience {})",
          best->since.size(), metric, best->value, best->step, rule_.patience);
      stop_ = true;
    }
  }

 private:
  // run.early_stop_patience evaluations in a row have not beaten the best (0: never).
  bool patience_reached() const {
    return rule_.patience > 0 && static_cast<int64_t>(rule_.best->since.size()) >= rule_.patience;
  }

  Checkpointer& checkpointer_;
  BestCheckpointRule rule_;
  RunPosition at_;
  std::atomic<bool>& stop_;
};

}  // namespace

std::unique_ptr<RunSink> best_checkpoint_sink(Checkpointer& checkpointer, BestCheckpointRule rule,
                                              const RunPosition& start,
                                              std::atomic<bool>& stop_requested) {
  return std::make_unique<BestCheckpointSink>(checkpointer, std::move(rule), start, stop_requested);
}

}  // namespace kiln::engine
