// The training loop, top to bottom: build the run's parts (Impl::build), take one optimizer step
// over a window of micro-batches and hand its report to the sinks (Impl::step), and run steps
// epoch after epoch with an evaluation at each end (Trainer::run). docs/architecture.md walks it.
#include "engine/trainer.hpp"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "engine/checkpointer.hpp"
#include "engine/checks.hpp"
#include "engine/evaluation.hpp"
#include "engine/loss.hpp"
#include "engine/lr_driver.hpp"
#include "engine/model_ema.hpp"
#include "engine/optimizer_side.hpp"
#include "engine/resume.hpp"
#include "engine/run_setup.hpp"
#include "engine/sinks/sinks.hpp"
#include "engine/step_report.hpp"
#include "engine/stop_signal.hpp"
#include "engine/torch_settings.hpp"
#include "engine/window_pass.hpp"
#include "io/heap.hpp"
#include "io/memory.hpp"
#include "io/status_line.hpp"
#include "plugin/adapters.hpp"

namespace kiln::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

// A run's parts, in the order they are built (and torn down in reverse), then where the loop is.
struct Trainer::Impl {
  const config::Pipeline& p;
  const config::Settings& s;
  RunOptions options;
  std::atomic<bool> cancel_requested{false};  // cancel(), an observer
  at::Device device{at::kCPU};
  Ranks ranks;
  std::optional<plugin::PrecisionAdapter> precision;
  PrecisionPlan plan;
  std::unique_ptr<RunData> data;
  ModelSide model;
  std::unique_ptr<Loss> loss;  // [loss], or the model's own
  ScheduleFrame frame;
  std::unique_ptr<OptimizerSide> optimizer;
  std::unique_ptr<ModelEma> ema;  // [ema], when ema.decay > 0
  std::unique_ptr<dist::DataParallel> ddp;
  std::unique_ptr<GraphedStep> graph;  // run.cuda_graph, where the run allows it
  std::unique_ptr<WindowPass> window;  // forward and backward: eager or graphed
  std::unique_ptr<Checkpointer> checkpointer;
  Sinks sinks;
  // The gradient pass on every step (run.grad_check), else on logged steps only.
  bool check_every_step = true;
  RunResult result;

  // ---- where the loop is ----
  TrainerState state = TrainerState::kReady;
  RunPosition position;      // the next step's place: epoch and batches of it already consumed
  RunPosition last;          // where the run is after its latest step (what a checkpoint saves)
  bool epoch_open = false;   // the loader has started position.epoch
  bool epoch_ended = false;  // the latest step finished its epoch
  int64_t step_epoch = 0;    // the epoch of the latest step
  bool eval_due = false;     // resumed at an epoch's last step: its evaluation is still to come
  Clock::time_point start;

  Impl(const config::Pipeline& pipeline, const RunOptions& run_options);
  void build();
  RunPosition resume(const io::RunFolder& folder);
  void subscribe_sinks(int64_t resumed_at);
  void place_loop();
  void step();
  bool stop_before_step();
  StepReport report_step(const WindowResult& w, StepOutcome outcome, const RankVote& vote,
                         const StepMeter& meter, Clock::time_point started);
  bool stop_after(const StepReport& report, const RankVote& vote);
  void end_run(TrainerState end);
  void end_epoch();
  void finish();
  io::EvalRecord evaluate();
  WindowInputs inputs(data::Loader& loader) {
    return {&loader,   model.model.get(), device, plan, model.channels_last, &optimizer->updates(),
            loss.get()};
  }
  // Whether optimizer step `step` gets a progress line.
  bool logged(int64_t step) const {
    return step % s.run.log_interval == 0 || step == frame.max_iters;
  }
  // Runs `f`; in a distributed run a failure names the rank to blame, not only a closed socket.
  template <typename F>
  auto blame(F&& f) -> decltype(f());
};

Trainer::Impl::Impl(const config::Pipeline& pipeline, const RunOptions& run_options)
    : p(pipeline), s(pipeline.settings), options(run_options) {
  // Before any tensor the run keeps: the metrics' tensor_* fields come from this counter.
  if (options.process.count_cpu_memory) io::count_cpu_tensor_memory();
  if (options.process.torch_settings) {
    apply_torch_settings(s.run);
  } else {
    report_torch_settings_left(s.run);
  }
  // What the configuration cannot do is refused before the process group forms; a component's
  // refusal of its options while the run is built is a configuration error too.
  as_config_errors(p, [&] {
    device = resolve_device(s.run.device);
    check_pipeline(p, device, options.launch ? options.launch->world_size : 1);
  });
  ranks = join_ranks(s.dist, options.launch ? &*options.launch : nullptr, device);
  blame([&] { as_config_errors(p, [&] { build(); }); });
  // Once the set-up is done, not before: its large buffers (the decoded test split) are then
  // mapped apart instead of lying among the small blocks every step frees and takes again, which
  // cost a tiny model's steps 9 % more malloc work (callgrind; docs/speed.md).
  if (options.process.tune_heap) io::tune_heap_for_training();
}

template <typename F>
auto Trainer::Impl::blame(F&& f) -> decltype(f()) {
  if (!ranks.group) return f();
  try {
    return f();
  } catch (const config::ConfigError&) {
    throw;  // every rank has the same configuration and refuses it alike
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("rank {}: {}\n  ranks: {}", ranks.group->rank(), e.what(),
                                         ranks.heartbeat->diagnose()));
  }
}

// ---- set-up: precision, data, model, optimizer side, resume, data parallelism, outputs -------
void Trainer::Impl::build() {
  at::manual_seed(s.run.seed);
  precision.emplace(*p.precision.component, p.precision.options, device.type());
  plan = plan_precision(precision->policy(), precision->name());
  data = load_run_data(p, device, ranks);
  model = build_model_side(p, *data, ranks, device, plan);
  loss = build_loss(p, model.model, data->train_set->num_classes(), device, ranks.group.get());
  if (const std::string what = loss->describe(); what != "cross_entropy") {
    spdlog::info("loss: {}", what);
  }
  frame = schedule_frame(p, data->batches_per_epoch);
  optimizer =
      std::make_unique<OptimizerSide>(p, *model.model, plan, *precision, frame, ranks.group.get());
  if (s.ema.decay > 0) {
    ema = std::make_unique<ModelEma>(*model.model, optimizer->updates().stepped(), s.ema);
  }

  const io::RunFolder folder = io::choose_run_folder(output_dir(p), options.resume);
  if (ranks.rank == 0) tidy_run_folder(folder);
  checkpointer = std::make_unique<Checkpointer>(p, folder, ranks.rank == 0, *model.model,
                                                *optimizer, ema.get());
  last = position = resume(folder);
  checkpointer->saved_at(position.step > 0 ? position.step : -1);
  // Ranks draw different dropout masks; the weights above were drawn alike (and are broadcast
  // from rank 0 by data parallelism anyway).
  if (ranks.world > 1 && options.resume.empty()) {
    at::manual_seed(s.run.seed + static_cast<uint64_t>(ranks.rank));
  }

  ddp = data_parallel(s.dist, ranks, *model.model);
  graph = step_graph(p, ranks, device, plan, model, *loss, *optimizer,
                     [this] { return position.step + 1; });
  window = graph ? graphed_window(inputs(*data->train), *graph, optimizer->scaler())
                 : eager_window(inputs(*data->train), ddp.get(), model.norm_window.get(),
                                s.dist.sync_every_micro_step);
  if (optimizer->updates().reevaluates()) {
    // The closure: the window's batches again at the weights the optimizer wrote; the model's
    // buffers (norm layers' running statistics) stay as the step's own pass left them.
    window->keep_batches(true);
    optimizer->updates().set_rerun([this](double scale) {
      at::NoGradGuard no_grad;
      std::vector<at::Tensor> buffers, saved;
      for (const at::Tensor& b : model.model->buffers()) {
        buffers.push_back(b);
        saved.push_back(b.clone());
      }
      WindowResult w;
      {
        at::AutoGradMode grad_mode(true);
        w = window->rerun(scale);
      }
      for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
      return w;
    });
  }
  // Loss scaling, clipping and half-precision gradients need the pass to step safely, and data
  // parallel ranks must agree on a skip from the same (all-reduced) gradients, not their own
  // losses. One rank has no one to agree with (the pass cost `kiln launch --nproc 1` 4 % of a
  // CPU step).
  check_every_step = s.run.grad_check_every_step || plan.loss_scaling != KILN_SCALE_NONE ||
                     plan.half_model() || ranks.world > 1 || optimizer->clip().any();

  log_run_summary(p, device, plan, *optimizer, frame);
  spdlog::info("{}", data->summary);
  result.test_accuracy = result.test_map = NAN;
  result.steps = position.step;
  start = Clock::now();
  subscribe_sinks(position.step);
  place_loop();
}

// The checkpoint a resume continues from (--resume), restored into the run; the start when none.
RunPosition Trainer::Impl::resume(const io::RunFolder& folder) {
  if (options.resume.empty()) return {};
  std::string chosen;
  const std::optional<io::CheckpointData> saved = choose_checkpoint(
      options.resume, folder.path + "/checkpoints", p, s.run.resume_fallback_previous, &chosen);
  if (!saved) return {};
  const RunPosition at = restore(*saved, *model.model, *optimizer, device);
  if (ema) ema->restore(*saved);
  spdlog::info("resumed from {}: step {}, epoch {}, batch {}", chosen, at.step, at.epoch,
               at.batches_in_epoch);
  return at;
}

// The run's side outputs, in the order they see each report: the log, the metrics file,
// TensorBoard, the program's observers, the heartbeat, the checkpoint cadence, the best
// checkpoint, the progress bar. Rank 0 alone writes files: the ranks hold the same state.
void Trainer::Impl::subscribe_sinks(int64_t resumed_at) {
  const bool writer = checkpointer->writer();
  const std::vector<std::string> groups = optimizer->group_names();
  sinks.add(log_sink(optimizer->lr(), optimizer->scaler(), plan));
  sinks.add(metrics_sink(writer ? options.metrics_path : std::string(), resumed_at > 0, groups));
  if (writer && s.run.tensorboard) {
    sinks.add(tensorboard_sink(checkpointer->run_dir() + "/tensorboard", resumed_at, groups));
  }
  if (writer && s.run.profile_steps > 0) {
    sinks.add(profile_sink({checkpointer->run_dir() + "/profile", s.run.profile_start,
                            s.run.profile_steps, resumed_at, frame.max_iters},
                           device));
  }
  sinks.add(observer_sink(options.on_step, options.on_eval, cancel_requested));
  sinks.add(heartbeat_sink(ranks.heartbeat.get()));
  sinks.add(checkpoint_sink(*checkpointer, s.run.checkpoint_every));
  if (s.run.checkpoint_best != "none") {
    sinks.add(best_checkpoint_sink(*checkpointer,
                                   {s.run.checkpoint_best, s.run.early_stop_patience,
                                    checkpointer->restore_best(s.run.checkpoint_best, resumed_at)},
                                   position, cancel_requested));
  }
  const bool bar = writer && options.status_line != nullptr && io::stderr_is_terminal();
  sinks.add(progress_sink(
      {s.run.epochs, frame.max_iters, resumed_at, start, bar ? options.status_line : nullptr}));
  checkpointer->set_flush([this] { sinks.flush(); });
}

// Where the loop starts: a run resumed at its very end (or with nothing to do) has no step left;
// one resumed at an epoch's last step opens the next epoch, after the evaluation the stopped run
// did not reach (Trainer::run).
void Trainer::Impl::place_loop() {
  if (position.step >= frame.max_iters || position.epoch > s.run.epochs) {
    state = TrainerState::kFinished;
  } else if (position.batches_in_epoch >= data->batches_per_epoch) {
    epoch_ended = eval_due = true;
    step_epoch = position.epoch;
    end_epoch();
  }
}

// ---- one optimizer step ------------------------------------------------------------------------
void Trainer::Impl::step() {
  if (state != TrainerState::kReady) throw std::logic_error("the run has no step left");
  eval_due = false;
  if (stop_before_step()) return;
  if (!epoch_open) {
    // A resumed run continues its epoch at the batch after the checkpoint.
    data->train->start_epoch(position.epoch - 1, position.batches_in_epoch);
    epoch_open = true;
  }
  // A window of micro-batches; an epoch's last may be shorter and is averaged over its own
  // length. The loss scale is fixed inside the window.
  const int64_t micro_batches =
      std::min(s.run.accumulation_steps, data->batches_per_epoch - position.batches_in_epoch);
  const double scale = optimizer->scaler().scale();
  const auto started = Clock::now();  // zero_grad is part of the step, as in a Python loop
  window->begin();
  const StepMeter meter(device, ddp.get());
  const WindowResult w = window->run(micro_batches, scale, position.step);
  position.batches_in_epoch += micro_batches;
  epoch_ended = position.batches_in_epoch >= data->batches_per_epoch || w.samples == 0;
  if (w.samples == 0) {  // the loader ran dry before the epoch's count: the epoch is over
    end_epoch();
    return;
  }
  const int64_t step = ++position.step;
  step_epoch = position.epoch;

  StepOutcome outcome = optimizer->step(step, w, check_every_step || logged(step));
  if (ema && outcome.verdict != StepVerdict::kStop) ema->update(step);
  const double loss = w.micro_batches == 1 ? outcome.check.loss * w.samples : outcome.check.loss;
  const int signal = options.signals != nullptr ? options.signals->received() : 0;
  const double samples = static_cast<double>(w.samples);
  RankVote vote = agree(ranks.group.get(), {loss, samples, signal, cancel_requested.load()});
  const StepReport report = report_step(w, std::move(outcome), vote, meter, started);
  last = position;
  result.steps = step;
  result.skipped_steps = optimizer->scaler().skipped_total();

  sinks.step(report);
  // A stop asked for during the step (an observer too) ends a one-process run after it; ranks
  // of a distributed run agree on one through the next step's vote.
  if (!ranks.group && cancel_requested.load()) vote.cancel = true;
  if (stop_after(report, vote)) return;
  if (epoch_ended) end_epoch();
  if (step >= frame.max_iters) finish();
}

// A stop asked for between steps (cancel, an observer) is honoured before any work.
bool Trainer::Impl::stop_before_step() {
  if (!cancel_requested.load() || ranks.group) return false;
  spdlog::info("cancelled: stopping after step {}", position.step);
  sinks.run_end();
  if (last.step > 0) checkpointer->save(last);
  state = TrainerState::kCancelled;
  return true;
}

StepReport Trainer::Impl::report_step(const WindowResult& w, StepOutcome outcome,
                                      const RankVote& vote, const StepMeter& meter,
                                      Clock::time_point started) {
  StepReport r;
  io::StepRecord& rec = r.record;
  rec.step = position.step;
  rec.epoch = position.epoch;
  rec.loss = vote.loss_sum / vote.samples;
  rec.lr = outcome.group_lrs;
  rec.data_time = w.data_time;
  rec.step_time = seconds_since(started) - w.data_time;
  rec.samples_per_s = vote.samples / (rec.step_time + rec.data_time);
  rec.started = std::chrono::duration<double>(started - start).count();
  rec.loss_scale = outcome.scale;
  rec.grad_norm = outcome.check.norm;
  rec.skipped = outcome.verdict != StepVerdict::kApply;
  rec.skipped_total = optimizer->scaler().skipped_total();
  rec.micro_batches = w.micro_batches;
  rec.reevaluations = outcome.reevaluations;
  meter.fill(rec, logged(rec.step));
  r.outcome = std::move(outcome);
  r.position = position;
  r.loss_sum = vote.loss_sum;
  r.samples = vote.samples;
  r.logged = logged(rec.step);
  r.last_of_epoch = epoch_ended;
  r.last_of_run = rec.step >= frame.max_iters;
  return r;
}

// After a step's report: a guard's stop (the weights saved), or a signal or a cancel any rank
// received. Each ends the run with a checkpoint.
bool Trainer::Impl::stop_after(const StepReport& report, const RankVote& vote) {
  const int64_t step = report.record.step;
  if (report.outcome.verdict == StepVerdict::kStop) {
    result.stopped = fmt::format("step {}: {}", step, optimizer->scaler().stop_reason());
    if (checkpointer->writer()) {
      result.saved_weights = checkpointer->save_weights(step, result.stopped);
      spdlog::error("{}; weights saved to {}", result.stopped, result.saved_weights);
    }
    end_run(TrainerState::kStopped);
    return true;
  }
  if (vote.signal == 0 && !vote.cancel) return false;
  if (vote.signal != 0) {
    spdlog::warn("signal {}: stopping after step {}", vote.signal, step);
    result.signal = vote.signal;
  } else {
    spdlog::info("cancelled: stopping after step {}", step);
  }
  end_run(TrainerState::kCancelled);
  return true;
}

void Trainer::Impl::end_run(TrainerState end) {
  sinks.run_end();
  checkpointer->save(last);
  state = end;
}

// The epoch's batches are consumed: the next step opens the next epoch.
void Trainer::Impl::end_epoch() {
  epoch_open = false;
  last = {position.step, position.epoch + 1, 0};
  position = last;
  sinks.epoch_end(last);
  if (position.epoch > s.run.epochs) finish();
}

// Every step is taken: the run's end is always checkpointed (a no-op when the last step already
// was).
void Trainer::Impl::finish() {
  if (state != TrainerState::kReady) return;
  end_run(TrainerState::kFinished);
  const int64_t skipped = optimizer->scaler().skipped_total();
  if (skipped > 0) {
    spdlog::info("{} of {} steps skipped for non-finite gradients", skipped, position.step);
  }
  // data.on_error = "skip": each replaced sample was logged with its path when first met.
  if (const int64_t replaced = data->train->skipped_samples(); replaced > 0) {
    spdlog::warn("{} unreadable training samples were replaced (data.on_error = \"skip\")",
                 replaced);
  }
}

io::EvalRecord Trainer::Impl::evaluate() {
  eval_due = false;
  if (!data->test) {
    throw std::logic_error("run.eval = false: the run opened no evaluation split to evaluate on");
  }
  const bool averaged = ema && s.ema.evaluate;
  const auto measure = [&] { return evaluate_model(inputs(*data->test), ranks.group.get()); };
  // The weights' average, else the optimizer's evaluation weights (the training weights for
  // most optimizers; Schedule-Free's x).
  const Evaluation e =
      averaged ? ema->with_average(measure) : optimizer->with_eval_weights(measure);
  // The epoch just trained: the open one, or the one before the next to open (0 before any).
  const int64_t epoch = epoch_open ? position.epoch : position.epoch - 1;
  io::EvalRecord record;
  record.epoch = epoch;
  record.step = position.step;
  record.accuracy = e.accuracy;
  record.loss = e.loss;
  record.accuracy_top5 = e.accuracy_top5;
  record.map = e.map;
  record.multi_label = e.multi_label;
  record.averaged = averaged;
  result.test_accuracy = e.accuracy;
  result.test_map = e.map;
  result.multi_label = e.multi_label;
  result.test_loss = e.loss;
  // A reacting LR policy (plateau) sees it before the next step asks for its rate.
  optimizer->observe(record);
  sinks.eval(record);
  return record;
}

// ---- the public face ---------------------------------------------------------------------------

Trainer::Trainer(const config::Pipeline& pipeline, const RunOptions& options)
    : impl_(std::make_unique<Impl>(pipeline, options)) {}

Trainer::~Trainer() = default;

void Trainer::step() {
  impl_->blame([&] { impl_->step(); });
  impl_->result.last_checkpoint = impl_->checkpointer->last();
  if (impl_->options.on_progress) impl_->options.on_progress(progress());
}

io::EvalRecord Trainer::evaluate() {
  io::EvalRecord record = impl_->blame([&] { return impl_->evaluate(); });
  if (impl_->options.on_progress) impl_->options.on_progress(progress());
  return record;
}

std::string Trainer::save_checkpoint() {
  impl_->blame([&] { impl_->checkpointer->save(impl_->last, /*even_if_off=*/true); });
  impl_->result.last_checkpoint = impl_->checkpointer->last();
  return impl_->checkpointer->writer() ? impl_->result.last_checkpoint : std::string();
}

// ---- the loop: steps, and an evaluation at each epoch's end -----------------------------------
RunResult Trainer::run() {
  Impl& t = *impl_;
  if (t.eval_due && t.s.run.eval) evaluate();
  while (t.state == TrainerState::kReady) {
    step();
    // At an epoch's end, and at the run's end mid-epoch; not after a stop or a cancel. A stop
    // an evaluation's observer asks for is honoured by the next step.
    const bool running = t.state == TrainerState::kReady || t.state == TrainerState::kFinished;
    if (running && (t.epoch_ended || t.state == TrainerState::kFinished) && t.s.run.eval) {
      evaluate();
    }
  }
  t.result.train_seconds = seconds_since(t.start);
  return t.result;
}

void Trainer::cancel() { impl_->cancel_requested = true; }

TrainerProgress Trainer::progress() const {
  const Impl& t = *impl_;
  TrainerProgress out;
  out.state = t.state;
  out.step = t.position.step;
  out.max_steps = t.frame.max_iters;
  out.epoch = t.step_epoch;
  out.epochs = t.s.run.epochs;
  out.batches_in_epoch = t.epoch_ended ? t.data->batches_per_epoch : t.position.batches_in_epoch;
  out.batches_per_epoch = t.data->batches_per_epoch;
  out.epoch_ended = t.epoch_ended;
  out.rank = t.ranks.rank;
  out.world_size = t.ranks.world;
  return out;
}

const RunResult& Trainer::result() const { return impl_->result; }

torch::nn::Module& Trainer::model() { return *impl_->model.model; }
OptimizerSide& Trainer::optimizer() { return *impl_->optimizer; }
ModelEma* Trainer::ema() { return impl_->ema.get(); }

RunResult train(const config::Pipeline& p, const RunOptions& options) {
  return Trainer(p, options).run();
}

}  // namespace kiln::engine
