#include "engine/sinks/sinks.hpp"

namespace kiln::engine {

namespace {

class ObserverSink final : public RunSink {
 public:
  ObserverSink(std::function<bool(const io::StepRecord&)> on_step,
               std::function<bool(const io::EvalRecord&)> on_eval, std::atomic<bool>& stop)
      : on_step_(std::move(on_step)), on_eval_(std::move(on_eval)), stop_(stop) {}

  void step(const StepReport& r) override {
    if (on_step_ && on_step_(r.record)) stop_ = true;
  }
  void eval(const io::EvalRecord& e) override {
    if (on_eval_ && on_eval_(e)) stop_ = true;
  }

 private:
  std::function<bool(const io::StepRecord&)> on_step_;
  std::function<bool(const io::EvalRecord&)> on_eval_;
  std::atomic<bool>& stop_;
};

}  // namespace

std::unique_ptr<RunSink> observer_sink(std::function<bool(const io::StepRecord&)> on_step,
                                       std::function<bool(const io::EvalRecord&)> on_eval,
                                       std::atomic<bool>& stop_requested) {
  if (!on_step && !on_eval) return nullptr;
  return std::make_unique<ObserverSink>(std::move(on_step), std::move(on_eval), stop_requested);
}

}  // namespace kiln::engine
