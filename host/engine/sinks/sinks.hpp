// The built-in sinks (run_sink.hpp), one file each.
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/precision.hpp"
#include "engine/sinks/run_sink.hpp"
#include "io/checkpoint.hpp"

namespace kiln::dist {
class Heartbeat;
}
namespace kiln::io {
class StatusLine;
}

namespace kiln::engine {

class Checkpointer;
class LossScaler;
class LrDriver;

// The run's log lines about a step (an lr change, a skipped step) and an evaluation.
std::unique_ptr<RunSink> log_sink(LrDriver& lr, const LossScaler& scaler,
                                  const PrecisionPlan& plan);

// JSON lines into `path` ("" writes nothing); `append` continues a resumed run's file.
std::unique_ptr<RunSink> metrics_sink(const std::string& path, bool append,
                                      const std::vector<std::string>& group_names);

// TensorBoard scalars into `dir`; `resumed_at` > 0 drops what an interrupted run logged after
// its checkpoint at that step.
std::unique_ptr<RunSink> tensorboard_sink(const std::string& dir, int64_t resumed_at,
                                          const std::vector<std::string>& group_names);

// A program's observers (the C API's callbacks): returning true asks the run to stop after this
// step, through `stop_requested`. Null when neither is set.
std::unique_ptr<RunSink> observer_sink(std::function<bool(const io::StepRecord&)> on_step,
                                       std::function<bool(const io::EvalRecord&)> on_eval,
                                       std::atomic<bool>& stop_requested);

// run.checkpoint_every steps, or (0) every epoch's end.
std::unique_ptr<RunSink> checkpoint_sink(Checkpointer& checkpointer, int64_t every);

// run.checkpoint_best: after an evaluation better by `metric` (accuracy, top5: higher; loss:
// lower) than the best so far (`best`: a resumed run's record), the checkpoint of the run's
// position (`start`, then the latest step's or epoch end's) is kept as the best. After
// `patience` (> 0) evaluations in a row that are not, it sets `stop_requested`
// (run.early_stop_patience); at once when the resumed record already holds that many.
struct BestCheckpointRule {
  std::string metric;
  int64_t patience = 0;
  std::optional<io::BestCheckpoint> best;
};
std::unique_ptr<RunSink> best_checkpoint_sink(Checkpointer& checkpointer, BestCheckpointRule rule,
                                              const RunPosition& start,
                                              std::atomic<bool>& stop_requested);

// The step a rank reached, for the heartbeat that names a hung rank. Null without one.
std::unique_ptr<RunSink> heartbeat_sink(dist::Heartbeat* heartbeat);

struct ProgressFrame {
  int64_t epochs = 0;
  int64_t max_steps = 0;
  int64_t first_step = 0;  // steps done before this process began (a resume): the ETA's base
  std::chrono::steady_clock::time_point start;
  io::StatusLine* bar = nullptr;  // the terminal line a progress bar is drawn on; null: none
};
// A progress line every logged step; on a terminal, a bar in between.
std::unique_ptr<RunSink> progress_sink(const ProgressFrame& frame);

struct ProfileWindow {
  std::string dir;         // folder the trace goes to (made if missing), steps_<first>-<last>.json
  int64_t first = 1;       // the first optimizer step traced (run.profile_start)
  int64_t steps = 0;       // steps traced (run.profile_steps); 0: none
  int64_t resumed_at = 0;  // the step a resumed run continues after
  int64_t max_steps = 0;   // the run's last step (no span opens past it); 0: unknown
};
// torch's profiler (Kineto) around `steps` optimizer steps: host ops, and on a CUDA `device` its
// kernels and copies, saved as a Chrome trace when the window closes or the run ends inside it.
// Null when steps is 0.
std::unique_ptr<RunSink> profile_sink(ProfileWindow window, c10::Device device);

}  // namespace kiln::engine
