#include "engine/checkpointer.hpp"
#include "engine/sinks/sinks.hpp"

namespace kiln::engine {

namespace {

class CheckpointSink final : public RunSink {
 public:
  CheckpointSink(Checkpointer& checkpointer, int64_t every)
      : checkpointer_(checkpointer), every_(every) {}

  void step(const StepReport& r) override {
    if (every_ > 0 && r.record.step % every_ == 0) checkpointer_.save(r.position);
  }
  void epoch_end(const RunPosition& next) override {
    if (every_ == 0) checkpointer_.save(next);
  }

 private:
  Checkpointer& checkpointer_;
  int64_t every_;
};

}  // namespace

std::unique_ptr<RunSink> checkpoint_sink(Checkpointer& checkpointer, int64_t every) {
  return std::make_unique<CheckpointSink>(checkpointer, every);
}

}  // namespace kiln::engine
