// A run's side outputs subscribe to what the loop produces (mmengine's hooks): a step's report,
// an evaluation, an epoch's end, the run's end. The metrics file, TensorBoard, the log and the
// progress bar, the C API's observers, the heartbeat and the checkpoint cadence are sinks; the
// step itself only produces the report (engine/trainer.cpp).
#pragma once

#include <memory>
#include <vector>

#include "engine/run_position.hpp"
#include "engine/step_report.hpp"
#include "io/metrics.hpp"

namespace kiln::engine {

class RunSink {
 public:
  virtual ~RunSink() = default;
  virtual void step(const StepReport& /*report*/) {}
  virtual void eval(const io::EvalRecord& /*record*/) {}
  // An epoch's batches are consumed; the run continues at `next` (step, next epoch, batch 0).
  virtual void epoch_end(const RunPosition& /*next*/) {}
  // Before a checkpoint: what it covers goes to the OS.
  virtual void flush() {}
  // The run ends (finished, stopped or cancelled): nothing may stay drawn on the terminal.
  virtual void run_end() {}
};

// The sinks of a run, called in the order they were added.
class Sinks {
 public:
  void add(std::unique_ptr<RunSink> sink) {
    if (sink) sinks_.push_back(std::move(sink));
  }
  void step(const StepReport& report) {
    for (auto& s : sinks_) s->step(report);
  }
  void eval(const io::EvalRecord& record) {
    for (auto& s : sinks_) s->eval(record);
  }
  void epoch_end(const RunPosition& next) {
    for (auto& s : sinks_) s->epoch_end(next);
  }
  void flush() {
    for (auto& s : sinks_) s->flush();
  }
  void run_end() {
    for (auto& s : sinks_) s->run_end();
  }

 private:
  std::vector<std::unique_ptr<RunSink>> sinks_;
};

}  // namespace kiln::engine
