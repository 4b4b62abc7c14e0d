#include "capi/session.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "capi/guard.hpp"
#include "capi/plugins.hpp"
#include "config/pipeline.hpp"
#include "dist/launch_env.hpp"
#include "engine/checks.hpp"
#include "engine/stop_signal.hpp"
#include "engine/trainer.hpp"
#include "io/log.hpp"
#include "io/status_line.hpp"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"

struct kiln_session {
  std::shared_ptr<const kiln::capi::PluginSet> plugins;
  // The plugins' components plus the session's in-process ones (kiln_session_options.components);
  // the pipeline points into it.
  kiln::plugin::Registry registry;
  kiln::config::Pipeline pipeline;
  // KILN_PROCESS_SIGNALS: the handlers the session installed, alive as long as the trainer.
  std::unique_ptr<kiln::engine::StopSignals> signals;
  std::unique_ptr<kiln::engine::Trainer> trainer;
  // The session's states of LibTorch's default generators (the CPU's, then each CUDA device's
  // when the session may use CUDA) while the program's are in place (OwnRandom).
  std::vector<at::Tensor> rng;
  kiln_metrics_callback callback = nullptr;  // set and read under the training lock
  void* user_data = nullptr;
  std::string failure;  // the error that failed the session; empty while it is usable

  // What other threads read (session_progress, session_last_metrics), under `snapshot_lock`.
  mutable std::mutex snapshot_lock;
  kiln::engine::TrainerProgress progress;
  bool failed = false;
  kiln_metrics last_step{}, last_eval{};
  const char* stop_reason = "";
  const char* last_checkpoint = "";
  // Strings handed out stay alive until destroy, so a pointer read on one thread is never
  // freed by a step on another.
  std::deque<std::string> strings;

  const char* keep(const std::string& s) {
    if (s.empty()) return "";
    if (!strings.empty() && strings.back() == s) return strings.back().c_str();
    strings.push_back(s);
    return strings.back().c_str();
  }
};

namespace kiln::capi {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

kiln_metrics blank_metrics(int32_t kind) {
  kiln_metrics m{};
  m.struct_size = sizeof(m);
  m.kind = kind;
  m.loss = m.accuracy = m.lr = m.grad_norm = m.loss_scale = kNaN;
  m.step_seconds = m.data_seconds = m.samples_per_second = kNaN;
  m.tensor_mb = m.tensor_peak_mb = m.activation_mb = m.accuracy_top5 = m.map = kNaN;
  return m;
}

kiln_metrics to_metrics(const io::StepRecord& r) {
  kiln_metrics m = blank_metrics(KILN_METRICS_STEP);
  m.skipped = r.skipped ? 1 : 0;
  m.step = r.step;
  m.epoch = r.epoch;
  m.loss = r.loss;
  m.lr = r.lr.empty() ? kNaN : r.lr.front();
  m.grad_norm = r.grad_norm;
  m.loss_scale = r.loss_scale;
  m.step_seconds = r.step_time;
  m.data_seconds = r.data_time;
  m.samples_per_second = r.samples_per_s;
  m.tensor_mb = r.tensor_mb;
  m.tensor_peak_mb = r.tensor_peak_mb;
  m.activation_mb = r.activation_mb;
  return m;
}

kiln_metrics to_metrics(const io::EvalRecord& r) {
  kiln_metrics m = blank_metrics(KILN_METRICS_EVAL);
  m.step = r.step;
  m.epoch = r.epoch;
  m.loss = r.loss;
  m.accuracy = r.accuracy;
  m.accuracy_top5 = r.accuracy_top5;
  m.map = r.map;
  m.weights = r.averaged ? KILN_WEIGHTS_AVERAGE : KILN_WEIGHTS_TRAINED;
  return m;
}

// Copies `m` into a caller's struct, as much of it as the caller's struct_size holds.
void copy_out(const kiln_metrics& m, kiln_metrics* out) {
  const size_t size = out->struct_size < sizeof(m) ? out->struct_size : sizeof(m);
  std::memcpy(reinterpret_cast<char*>(out) + sizeof(size_t),
              reinterpret_cast<const char*>(&m) + sizeof(size_t), size - sizeof(size_t));
}

void update_snapshot(kiln_session* s, const engine::TrainerProgress& p);

// Records `m` for other threads, then hands it to the callback; true when the callback asks
// to stop. The callback runs without the snapshot lock, so it may read progress itself.
bool publish(kiln_session* s, const kiln_metrics& m) {
  {
    std::lock_guard<std::mutex> guard(s->snapshot_lock);
    (m.kind == KILN_METRICS_STEP ? s->last_step : s->last_eval) = m;
  }
  if (s->callback == nullptr) return false;
  // The callback sees the step it is told about in session_progress too.
  update_snapshot(s, s->trainer->progress());
  set_in_callback(true);
  const int32_t verdict = s->callback(s->user_data, &m);
  set_in_callback(false);
  return verdict != 0;
}

void update_snapshot(kiln_session* s, const engine::TrainerProgress& p) {
  const engine::RunResult& r = s->trainer->result();
  std::lock_guard<std::mutex> guard(s->snapshot_lock);
  s->progress = p;
  const std::string reason =
      !r.stopped.empty() ? r.stopped
      : p.state == engine::TrainerState::kCancelled
          ? (r.signal != 0 ? "signal " + std::to_string(r.signal) : std::string("cancelled"))
          : std::string();
  s->stop_reason = s->keep(reason);
  s->last_checkpoint = s->keep(r.last_checkpoint);
}

// The line sessions draw their progress bar on when stderr is a terminal, erased by every log
// line. One per process, as the console logger that erases it; never destroyed, since the
// logger may still write during static destruction.
io::StatusLine& terminal_line() {
  static auto* line = new io::StatusLine(stderr);
  return *line;
}

void set_log_level(int32_t level) {
  // Once per process: logs go to stderr, so a program's stdout stays its own.
  static std::once_flag once;
  std::call_once(once, [] {
    kiln::io::install_console_logger(kiln::io::ConsoleStream::kStderr, &terminal_line());
  });
  switch (level) {
    case KILN_SESSION_LOG_DEBUG:
      spdlog::set_level(spdlog::level::debug);
      break;
    case KILN_SESSION_LOG_INFO:
      spdlog::set_level(spdlog::level::info);
      break;
    case KILN_SESSION_LOG_WARN:
      spdlog::set_level(spdlog::level::warn);
      break;
    case KILN_SESSION_LOG_ERROR:
      spdlog::set_level(spdlog::level::err);
      break;
    case KILN_SESSION_LOG_OFF:
      spdlog::set_level(spdlog::level::off);
      break;
    default:
      break;
  }
}

// The strings of a caller's array; a NULL array with a count, or a NULL entry, is the caller's
// mistake (KILN_ERR_INVALID_ARGUMENT), reported before anything is loaded.
kiln_status* strings_of(const char* const* items, size_t count, const char* what,
                        std::vector<std::string>& out) {
  if (count > 0 && items == nullptr) {
    return make_status(KILN_ERR_INVALID_ARGUMENT, std::string("kiln_session_options.") + what +
                                                      " is NULL but its count is " +
                                                      std::to_string(count));
  }
  out.clear();
  for (size_t i = 0; i < count; ++i) {
    if (items[i] == nullptr) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, std::string("kiln_session_options.") + what +
                                                        "[" + std::to_string(i) + "] is NULL");
    }
    out.emplace_back(items[i]);
  }
  return nullptr;
}

// For the length of one training call: the session's states of LibTorch's default generators
// (the CPU's, and each CUDA device's unless the session runs on the CPU) in place of the
// program's, which are put back after. A session's dropout masks and initial weights then never
// depend on another session's steps or seeding, or on the program's own draws.
class OwnRandom {
 public:
  explicit OwnRandom(kiln_session* s) : s_(s) {
    generators_.push_back(at::detail::getDefaultCPUGenerator());
    // CUDA's generators only where the session may use them: a CPU session never touches CUDA.
    if (s_->pipeline.settings.run.device != "cpu" && at::hasCUDA()) {
      const auto n = static_cast<c10::DeviceIndex>(at::getNumGPUs());
      for (c10::DeviceIndex i = 0; i < n; ++i)
        generators_.push_back(at::globalContext().defaultGenerator(at::Device(at::kCUDA, i)));
    }
    for (auto& g : generators_) program_.push_back(g.get_state());
    if (s_->rng.size() == generators_.size()) {
      for (size_t i = 0; i < generators_.size(); ++i) generators_[i].set_state(s_->rng[i]);
    }
  }
  ~OwnRandom() {
    try {
      s_->rng.clear();
      for (size_t i = 0; i < generators_.size(); ++i) {
        s_->rng.push_back(generators_[i].get_state());
        generators_[i].set_state(program_[i]);
      }
    } catch (...) {
      // Only out of memory: the program's state may be lost, nothing else is at stake.
    }
  }
  OwnRandom(const OwnRandom&) = delete;
  OwnRandom& operator=(const OwnRandom&) = delete;

 private:
  kiln_session* s_;
  std::vector<at::Generator> generators_;  // handles on the default generators
  std::vector<at::Tensor> program_;        // their states as the program left them
};

// The process-wide settings a session's options ask for (KILN_PROCESS_*).
engine::ProcessSettings process_settings_of(uint32_t bits) {
  engine::ProcessSettings p;
  p.count_cpu_memory = (bits & KILN_PROCESS_COUNT_CPU_MEMORY) != 0;
  p.torch_settings = (bits & KILN_PROCESS_TORCH_SETTINGS) != 0;
  p.tune_heap = (bits & KILN_PROCESS_TUNE_HEAP) != 0;
  return p;
}

// Validates the options' in-process components as plugin libraries are, calls their init and
// adds them to `registry`: a refusal is KILN_ERR_PLUGIN_REFUSED, as a library's.
kiln_status* add_components(const kiln_session_options& o, plugin::Registry& registry) {
  if (o.component_count > 0 && o.components == nullptr) {
    return make_status(KILN_ERR_INVALID_ARGUMENT,
                       "kiln_session_options.components is NULL but its count is " +
                           std::to_string(o.component_count));
  }
  const std::string origin = o.component_origin != nullptr && o.component_origin[0] != '\0'
                                 ? o.component_origin
                                 : "<in-process>";
  plugin::LibraryLoader loader(plugin::host_api());
  for (size_t i = 0; i < o.component_count; ++i) {
    try {
      loader.add_descriptor(o.components[i], origin, registry);
    } catch (const plugin::LoadError& e) {
      return make_status(KILN_ERR_PLUGIN_REFUSED, std::string("plugin refused: ") + e.what());
    }
  }
  return nullptr;
}

// Builds a session from TOML text; `file` is the path it came from, or empty.
kiln_status* create(const std::string& text, const std::string& name, const std::string& file,
                    const kiln_session_options* options, kiln_session** out) {
  if (out == nullptr) return make_status(KILN_ERR_INVALID_ARGUMENT, "session_create: out is NULL");
  *out = nullptr;
  if (in_callback()) {
    return make_status(KILN_ERR_FAILED_PRECONDITION,
                       "session_create: not allowed inside a metrics callback");
  }
  kiln_session_options o{};
  if (options != nullptr) {
    if (kiln_status* s =
            check_size(options->struct_size, KILN_SESSION_OPTIONS_V1_SIZE, "kiln_session_options"))
      return s;
    std::memcpy(&o, options, std::min(options->struct_size, sizeof(o)));
  }
  if ((o.process_settings & ~static_cast<uint32_t>(KILN_PROCESS_ALL)) != 0) {
    return make_status(KILN_ERR_INVALID_ARGUMENT,
                       "kiln_session_options.process_settings has unknown bits: " +
                           std::to_string(o.process_settings));
  }
  std::lock_guard<std::mutex> lock(training_lock());
  set_log_level(o.log_level);

  std::vector<std::string> overrides, dirs;
  if (kiln_status* s = strings_of(o.overrides, o.override_count, "overrides", overrides)) return s;
  if (kiln_status* s = strings_of(o.plugin_paths, o.plugin_path_count, "plugin_paths", dirs)) {
    return s;
  }
  auto session = std::make_unique<kiln_session>();
  for (const auto& d : file.empty() ? config::read_plugin_paths_text(text, name, overrides)
                                    : config::read_plugin_paths(file, overrides)) {
    dirs.push_back(d);
  }
  session->plugins = plugins_for(dirs);
  if (!session->plugins->refused.empty()) {
    std::string message;
    for (const auto& r : session->plugins->refused) message += (message.empty() ? "" : "\n") + r;
    return make_status(KILN_ERR_PLUGIN_REFUSED, "plugin refused: " + message);
  }
  session->registry = session->plugins->registry;
  if (kiln_status* st = add_components(o, session->registry)) return st;
  session->pipeline = file.empty()
                          ? config::load_pipeline_text(text, name, overrides, session->registry)
                          : config::load_pipeline(file, overrides, session->registry);
  // The Trainer checks the pipeline and refuses what the configuration cannot do as a located
  // config::ConfigError (KILN_ERR_CONFIG) before its first step.
  engine::RunOptions run;
  run.metrics_path = o.metrics_path != nullptr ? o.metrics_path : "";
  run.resume = o.resume != nullptr ? o.resume : "";
  run.process = process_settings_of(o.process_settings);
  run.status_line = &terminal_line();
  if (o.distributed != 0) run.launch = dist::read_launch_env();
  if ((o.process_settings & KILN_PROCESS_SIGNALS) != 0) {
    try {
      session->signals = std::make_unique<engine::StopSignals>();
    } catch (const std::logic_error&) {
      return make_status(KILN_ERR_FAILED_PRECONDITION,
                         "session_create: KILN_PROCESS_SIGNALS: another session of this process "
                         "holds the signal handlers");
    }
    run.signals = session->signals.get();
  }
  kiln_session* s = session.get();
  run.on_step = [s](const io::StepRecord& r) { return publish(s, to_metrics(r)); };
  run.on_eval = [s](const io::EvalRecord& r) { return publish(s, to_metrics(r)); };
  run.on_progress = [s](const engine::TrainerProgress& p) { update_snapshot(s, p); };
  {
    const OwnRandom random(s);
    session->trainer = std::make_unique<engine::Trainer>(session->pipeline, run);
  }
  update_snapshot(s, session->trainer->progress());
  *out = session.release();
  return nullptr;
}

// The checks every serialized call on a session makes; a status when the call may not go on.
kiln_status* usable(const kiln_session* s, const char* call) {
  if (s == nullptr)
    return make_status(KILN_ERR_INVALID_ARGUMENT, std::string(call) + ": NULL session");
  if (in_callback()) {
    return make_status(KILN_ERR_FAILED_PRECONDITION,
                       std::string(call) + ": not allowed inside a metrics callback");
  }
  if (!s->failure.empty()) {
    return make_status(
        KILN_ERR_FAILED_PRECONDITION,
        std::string(call) + ": the session failed earlier (" + s->failure + "); destroy it");
  }
  return nullptr;
}

// Runs a training call under the lock; an exception fails the session for good.
template <typename F>
kiln_status* train_call(kiln_session* s, const char* call, F&& f) {
  return guarded(KILN_ERR_INTERNAL, [&]() -> kiln_status* {
    if (kiln_status* st = usable(s, call)) return st;
    std::lock_guard<std::mutex> lock(training_lock());
    try {
      const OwnRandom random(s);
      return f();
    } catch (...) {
      kiln_status* st = status_from_exception(KILN_ERR_RUN_FAILED);
      if (st == nullptr) return st;
      st->code = KILN_ERR_RUN_FAILED;
      s->failure = st->message.empty() ? "an error" : st->message;
      set_in_callback(false);
      std::lock_guard<std::mutex> guard(s->snapshot_lock);
      s->failed = true;
      return st;
    }
  });
}

// A status when the session has no step left (finished, cancelled or stopped); NULL if ready.
kiln_status* not_ready(const kiln_session* s, const char* call) {
  static const char* const names[] = {"ready", "finished", "cancelled", "stopped"};
  const engine::TrainerState state = s->trainer->progress().state;
  if (state == engine::TrainerState::kReady) return nullptr;
  return make_status(KILN_ERR_FAILED_PRECONDITION, std::string(call) + ": the session is " +
                                                       names[static_cast<int>(state)] +
                                                       "; no step is left");
}

}  // namespace

kiln_status* session_create_from_file(const char* path, const kiln_session_options* options,
                                      kiln_session** out) {
  return guarded(KILN_ERR_RUN_FAILED, [&]() -> kiln_status* {
    if (path == nullptr) {
      if (out != nullptr) *out = nullptr;
      return make_status(KILN_ERR_INVALID_ARGUMENT, "session_create_from_file: path is NULL");
    }
    return create({}, path, path, options, out);
  });
}

kiln_status* session_create_from_string(const char* toml, const char* name,
                                        const kiln_session_options* options, kiln_session** out) {
  return guarded(KILN_ERR_RUN_FAILED, [&]() -> kiln_status* {
    if (toml == nullptr || name == nullptr) {
      if (out != nullptr) *out = nullptr;
      return make_status(KILN_ERR_INVALID_ARGUMENT,
                         "session_create_from_string: toml or name is NULL");
    }
    return create(toml, name, {}, options, out);
  });
}

void session_destroy(kiln_session* session) {
  if (session == nullptr) return;
  // Inside the callback this thread holds the training lock and the session is mid-step:
  // destroying it there would deadlock or pull the trainer from under itself.
  if (in_callback()) {
    spdlog::error("session_destroy inside a metrics callback is ignored; destroy after the call");
    return;
  }
  try {
    std::lock_guard<std::mutex> lock(training_lock());
    delete session;
  } catch (...) {
    // Destruction swallows: there is no status to return it in.
  }
}

kiln_status* session_set_metrics_callback(kiln_session* s, kiln_metrics_callback callback,
                                          void* user_data) {
  return guarded(KILN_ERR_INTERNAL, [&]() -> kiln_status* {
    if (s == nullptr)
      return make_status(KILN_ERR_INVALID_ARGUMENT, "session_set_metrics_callback: NULL session");
    if (in_callback()) {
      return make_status(KILN_ERR_FAILED_PRECONDITION,
                         "session_set_metrics_callback: not allowed inside a metrics callback");
    }
    std::lock_guard<std::mutex> lock(training_lock());
    s->callback = callback;
    s->user_data = callback != nullptr ? user_data : nullptr;
    return nullptr;
  });
}

kiln_status* session_run(kiln_session* s) {
  return train_call(s, "session_run", [&]() -> kiln_status* {
    if (kiln_status* st = not_ready(s, "session_run")) return st;
    s->trainer->run();
    return nullptr;
  });
}

kiln_status* session_step(kiln_session* s) {
  return train_call(s, "session_step", [&]() -> kiln_status* {
    if (kiln_status* st = not_ready(s, "session_step")) return st;
    s->trainer->step();
    return nullptr;
  });
}

kiln_status* session_evaluate(kiln_session* s, kiln_metrics* out) {
  return train_call(s, "session_evaluate", [&]() -> kiln_status* {
    if (out != nullptr) {
      if (kiln_status* st = check_size(out->struct_size, KILN_METRICS_V1_SIZE, "kiln_metrics"))
        return st;
    }
    const kiln_metrics m = to_metrics(s->trainer->evaluate());
    if (out != nullptr) copy_out(m, out);
    return nullptr;
  });
}

kiln_status* session_save_checkpoint(kiln_session* s, const char** path) {
  return train_call(s, "session_save_checkpoint", [&]() -> kiln_status* {
    const std::string folder = s->trainer->save_checkpoint();
    update_snapshot(s, s->trainer->progress());
    if (path != nullptr) {
      std::lock_guard<std::mutex> guard(s->snapshot_lock);
      *path = s->keep(folder);
    }
    return nullptr;
  });
}

void session_cancel(kiln_session* s) {
  if (s != nullptr && s->trainer) s->trainer->cancel();
}

kiln_status* session_progress(const kiln_session* s, kiln_progress* out) {
  return guarded(KILN_ERR_INTERNAL, [&]() -> kiln_status* {
    if (s == nullptr || out == nullptr) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "session_progress: session or out is NULL");
    }
    if (kiln_status* st = check_size(out->struct_size, KILN_PROGRESS_V1_SIZE, "kiln_progress"))
      return st;
    kiln_progress p{};
    {
      std::lock_guard<std::mutex> guard(s->snapshot_lock);
      const engine::TrainerProgress& t = s->progress;
      p.state = s->failed                                     ? KILN_SESSION_FAILED
                : t.state == engine::TrainerState::kReady     ? KILN_SESSION_READY
                : t.state == engine::TrainerState::kFinished  ? KILN_SESSION_FINISHED
                : t.state == engine::TrainerState::kCancelled ? KILN_SESSION_CANCELLED
                                                              : KILN_SESSION_STOPPED;
      p.epoch_ended = t.epoch_ended ? 1 : 0;
      p.step = t.step;
      p.max_steps = t.max_steps;
      p.epoch = t.epoch;
      p.epochs = t.epochs;
      p.batches_in_epoch = t.batches_in_epoch;
      p.batches_per_epoch = t.batches_per_epoch;
      p.rank = t.rank;
      p.world_size = t.world_size;
      p.stop_reason = s->stop_reason;
      p.last_checkpoint = s->last_checkpoint;
    }
    const size_t size = out->struct_size < sizeof(p) ? out->struct_size : sizeof(p);
    std::memcpy(reinterpret_cast<char*>(out) + sizeof(size_t),
                reinterpret_cast<const char*>(&p) + sizeof(size_t), size - sizeof(size_t));
    return nullptr;
  });
}

kiln_status* session_last_metrics(const kiln_session* s, int32_t kind, kiln_metrics* out) {
  return guarded(KILN_ERR_INTERNAL, [&]() -> kiln_status* {
    if (s == nullptr || out == nullptr) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "session_last_metrics: session or out is NULL");
    }
    if (kind != KILN_METRICS_STEP && kind != KILN_METRICS_EVAL) {
      return make_status(KILN_ERR_INVALID_ARGUMENT,
                         "session_last_metrics: kind must be KILN_METRICS_STEP (1) or "
                         "KILN_METRICS_EVAL (2), not " +
                             std::to_string(kind));
    }
    if (kiln_status* st = check_size(out->struct_size, KILN_METRICS_V1_SIZE, "kiln_metrics"))
      return st;
    kiln_metrics m;
    {
      std::lock_guard<std::mutex> guard(s->snapshot_lock);
      m = kind == KILN_METRICS_STEP ? s->last_step : s->last_eval;
    }
    if (m.kind == 0) m = blank_metrics(0);
    copy_out(m, out);
    return nullptr;
  });
}

kiln_status* with_trainer(kiln_session* s, const char* call,
                          const std::function<kiln_status*(engine::Trainer&)>& f) {
  return guarded(KILN_ERR_INTERNAL, [&]() -> kiln_status* {
    if (kiln_status* st = usable(s, call)) return st;
    std::lock_guard<std::mutex> lock(training_lock());
    return f(*s->trainer);
  });
}

}  // namespace kiln::capi
