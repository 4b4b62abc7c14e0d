// The training run of a resolved pipeline: one process, or one rank of a data-parallel run.
// `Trainer` takes it one optimizer step at a time (the C API's session); `train` runs it to the
// end (`kiln run`).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "config/pipeline.hpp"
#include "dist/launch_env.hpp"
#include "io/metrics.hpp"

namespace kiln::io {
class StatusLine;
}
namespace torch::nn {
class Module;
}

namespace kiln::engine {

class StopSignals;
class OptimizerSide;
class ModelEma;

// Where a trainer stands.
enum class TrainerState {
  kReady,      // more steps to take
  kFinished,   // every step of the run is done
  kCancelled,  // cancel(), a signal or an observer stopped it after a whole step
  kStopped,    // a guard stopped it (RunResult::stopped says why; the weights were saved)
};

struct TrainerProgress {
  TrainerState state = TrainerState::kReady;
  int64_t step = 0;       // optimizer steps taken (over resumes)
  int64_t max_steps = 0;  // steps the whole run takes
  int64_t epoch = 0;      // epoch of the latest step (1-based; 0 before any)
  int64_t epochs = 0;
  int64_t batches_in_epoch = 0;   // of `epoch`, consumed so far
  int64_t batches_per_epoch = 0;  // on this rank
  bool epoch_ended = false;       // the latest step was the last of its epoch
  int rank = 0, world_size = 1;
};

// What a run may change in the whole process, beyond its own objects. `kiln run` owns its
// process and asks for all of it; a library's session (the C API) only for what its caller
// opts into, so that it leaves the program that loaded it as it found it.
struct ProcessSettings {
  // c10's CPU allocator becomes Kiln's counting one (io/memory) before the run's tensors: the
  // metrics' tensor_* fields on the CPU, which are NaN without it.
  bool count_cpu_memory = false;
  // run.threads, run.tf32 and run.cudnn_benchmark on torch's global context (torch_settings).
  bool torch_settings = false;
  // glibc's malloc thresholds for training (io/heap), once the run is built.
  bool tune_heap = false;
};

struct RunOptions {
  std::string metrics_path;  // JSON-lines metrics; empty: none
  std::string resume;        // "auto" (newest usable checkpoint), a checkpoint folder, or ""
  // This process's place in a distributed run (from the launcher's environment); nullopt: a
  // single-process run. With it, the run joins a c10d process group and trains data-parallel.
  std::optional<dist::LaunchEnv> launch;
  ProcessSettings process;  // nothing process-wide unless asked
  // The caller's SIGINT/SIGTERM handlers (`kiln run`: the CLI's), which stop the run after a
  // whole step (with a checkpoint); they outlive the trainer. nullptr: the program owns its
  // signals (a C API session, unless its options ask).
  const StopSignals* signals = nullptr;
  // The terminal line the progress bar is drawn on when stderr is a terminal (the caller's,
  // whose log lines erase it first; io/log); it outlives the trainer. nullptr: no bar.
  io::StatusLine* status_line = nullptr;
  // Called with every record the metrics file gets; returning true stops the run after this
  // step, as a signal does. Empty: none.
  std::function<bool(const io::StepRecord&)> on_step;
  std::function<bool(const io::EvalRecord&)> on_eval;
  // Called at the end of every Trainer::step and evaluate, state updated (the C API's
  // snapshot for other threads).
  std::function<void(const TrainerProgress&)> on_progress;
};

struct RunResult {
  double test_accuracy = 0.0;  // last evaluation, fraction in [0, 1]; NaN when none ran
  double test_loss = 0.0;
  double test_map = 0.0;  // last evaluation of multi-label data: mean average precision; else NaN
  bool multi_label = false;     // the evaluations were of multi-label data (test_map their metric)
  int64_t steps = 0;            // optimizer steps attempted (applied + skipped)
  int64_t skipped_steps = 0;    // steps skipped for non-finite gradients
  std::string stopped;          // why a guard stopped the run early; empty when it ran to the end
  std::string saved_weights;    // the weights file written when a guard stopped the run
  int signal = 0;               // SIGINT/SIGTERM that ended the run early (checkpoint written)
  std::string last_checkpoint;  // the newest checkpoint this run wrote
  double train_seconds = 0.0;   // wall time of the training loop (evaluation included)
};

// One training run, built from `pipeline` (which must outlive it) and taken step by step. Not
// thread-safe, except cancel(). Construction throws on configuration problems found at build
// time (capabilities, missing data); the other calls throw on component or I/O errors, after
// which the trainer must not be used again.
class Trainer {
 public:
  Trainer(const config::Pipeline& pipeline, const RunOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step (a window of accumulation_steps micro-batches), its log and metrics,
  // and the checkpoints run.checkpoint_every asks for; the run's last step also writes the
  // final checkpoint. Requires state kReady.
  void step();
  // Test-split accuracy and loss now; the record goes to the metrics file and on_eval.
  io::EvalRecord evaluate();
  // A checkpoint of the state after the latest step, even with run.checkpoints off. Returns
  // its folder ("" on ranks other than 0, which write nothing).
  std::string save_checkpoint();
  // Steps until the state leaves kReady, evaluating at each epoch's end when run.eval and
  // checkpointing as configured, as `kiln run` does.
  RunResult run();
  // Asks the run to stop after the step in progress (or before the next one). Any thread.
  void cancel();

  TrainerProgress progress() const;
  const RunResult& result() const;

  // The run's live model and optimizer side, between calls (the C API's session_tensors and
  // session_load_tensors): their tensors are the ones the next step trains.
  torch::nn::Module& model();
  OptimizerSide& optimizer();
  // [ema]'s average; null when ema.decay = 0.
  ModelEma* ema();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Builds every component from `pipeline` and trains to the end: Trainer(...).run().
RunResult train(const config::Pipeline& pipeline, const RunOptions& options);

}  // namespace kiln::engine
