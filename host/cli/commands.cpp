#include "cli/commands.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>

#include "config/pipeline.hpp"
#include "config/reference.hpp"
#include "config/toml_text.hpp"
#include "config/value_check.hpp"
#include "data/source.hpp"
#include "engine/checkpointer.hpp"
#include "engine/checks.hpp"
#include "engine/lr_schedule.hpp"
#include "engine/model_ema.hpp"
#include "engine/optimizer_side.hpp"
#include "engine/plan.hpp"
#include "engine/preflight.hpp"
#include "engine/run_data.hpp"
#include "engine/stop_signal.hpp"
#include "engine/trainer.hpp"
#include "io/checkpoint.hpp"
#include "io/error_text.hpp"
#include "io/metrics_plot.hpp"
#include "io/run_folder.hpp"
#include "io/safetensors.hpp"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/status.hpp"

namespace kiln::cli {
namespace {

constexpr int kRunFailed = 1, kConfigError = 2, kPluginRefused = 3, kStoppedByGuard = 4;

// Plugins loaded for this process; the loader keeps libraries loaded until exit.
struct Plugins {
  std::unique_ptr<plugin::LibraryLoader> loader;
  plugin::Registry registry;
  std::vector<std::string> refused;
};

Plugins load_plugins(const std::vector<std::string>& extra_dirs) {
  Plugins p;
  p.loader = std::make_unique<plugin::LibraryLoader>(plugin::host_api());
  p.registry = plugin::load_all(*p.loader, plugin::plugin_search_path(extra_dirs), p.refused);
  return p;
}

void print_refused(const std::vector<std::string>& refused) {
  for (const auto& r : refused) fmt::print(stderr, "error: plugin refused: {}\n", r);
}

// Inside a catch: prints the exception being handled and returns its exit code, a configuration
// error's (the message is already file:line:column) or a run-time failure's. Any other type goes
// on to main's backstop.
int report_failure() {
  // No C++ stack trace for the reader (c10::Error carries one in what()); -v logs it.
  const auto shown = [](const char* what) {
    std::string text = io::without_backtrace(what);
    if (text != what) spdlog::debug("the error with its stack trace: {}", what);
    return text;
  };
  try {
    throw;
  } catch (const config::ConfigError& e) {
    fmt::print(stderr, "{}\n", shown(e.what()));
    return kConfigError;
  } catch (const data::BrokenSource& e) {
    // A dataset plugin that broke its contract is refused, as a library that fails to load.
    fmt::print(stderr, "error: plugin refused: {}\n", shown(e.what()));
    return kPluginRefused;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", shown(e.what()));
    return kRunFailed;
  }
}

// Loads plugins (with the pipeline's own folders) and resolves the pipeline; with
// `preflight_world` > 0 also creates every component as a run of that many ranks would
// (engine::preflight). On failure prints the reason and sets `exit_code`.
bool resolve(const PipelineArgs& args, Plugins& plugins, config::Pipeline& pipeline, int& exit_code,
             int64_t preflight_world = 1, std::string* data_summary = nullptr) {
  try {
    plugins = load_plugins(config::read_plugin_paths(args.file, args.overrides));
    if (!plugins.refused.empty()) {
      print_refused(plugins.refused);
      exit_code = kPluginRefused;
      return false;
    }
    pipeline = config::load_pipeline(args.file, args.overrides, plugins.registry);
    if (preflight_world > 0) {
      const std::string data = engine::as_config_errors(pipeline, [&] {
        return engine::preflight(pipeline, engine::resolve_device(pipeline.settings.run.device),
                                 preflight_world);
      });
      if (data_summary != nullptr) *data_summary = data;
    }
    return true;
  } catch (...) {
    exit_code = report_failure();
    return false;
  }
}

std::string caps_text(uint64_t f) {
  std::vector<std::string> parts;
  const std::pair<uint64_t, const char*> names[] = {
      {KILN_CAP_DEVICE_CPU, "cpu"},
      {KILN_CAP_DEVICE_CUDA, "cuda"},
      {KILN_CAP_DTYPE_F32, "fp32"},
      {KILN_CAP_DTYPE_F16, "fp16"},
      {KILN_CAP_DTYPE_BF16, "bf16"},
      {KILN_CAP_DTYPE_F64, "fp64"},
      {KILN_CAP_NEEDS_COLLECTIVES, "collectives"},
      {KILN_CAP_IN_PLACE, "in-place"},
      {KILN_CAP_MULTI_TENSOR, "multi-tensor"},
      {KILN_CAP_CAPTURABLE, "capturable"},
      {KILN_CAP_WRAPS_OPTIMIZER, "wraps an optimizer"}};
  for (const auto& [bit, name] : names) {
    if (f & bit) parts.emplace_back(name);
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

int run(const PipelineArgs& args, const std::string& metrics_path, const std::string& resume,
        io::StatusLine& terminal) {
  Plugins plugins;
  config::Pipeline pipeline;
  int code = 0;
  if (!resolve(args, plugins, pipeline, code, /*preflight_world=*/0)) return code;
  engine::RunOptions options;
  try {
    options.launch = dist::read_launch_env();
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "error: launch environment: {}\n", e.what());
    return kConfigError;
  }
  // In a distributed run rank 0 alone reports progress; the others speak up only for warnings.
  if (options.launch && options.launch->rank != 0) spdlog::set_level(spdlog::level::warn);
  try {
    options.metrics_path = metrics_path;
    options.resume = resume;
    options.status_line = &terminal;
    // `kiln run` owns its process: the counting allocator, torch's settings, the heap's tuning,
    // and the signals, which stop the run after a whole step with a checkpoint.
    options.process.count_cpu_memory = true;
    options.process.torch_settings = true;
    options.process.tune_heap = true;
    const engine::StopSignals signals;
    options.signals = &signals;
    engine::RunResult r = engine::train(pipeline, options);
    if (r.signal != 0) {
      fmt::print(stderr, "stopped by signal {} after step {}; checkpoint: {}\n", r.signal, r.steps,
                 r.last_checkpoint.empty() ? "(checkpoints off)" : r.last_checkpoint);
      return 128 + r.signal;
    }
    if (!r.stopped.empty()) {
      fmt::print(stderr, "error: training stopped at {}\nweights of the last step: {}\n", r.stopped,
                 r.saved_weights);
      return kStoppedByGuard;
    }
    if (r.multi_label) {
      spdlog::info("final test mAP: {:.2f}% (loss {:.4f}) after {} steps in {:.1f} s",
                   100.0 * r.test_map, r.test_loss, r.steps, r.train_seconds);
    } else if (std::isnan(r.test_accuracy)) {
      spdlog::info("done: {} steps in {:.1f} s (no evaluation)", r.steps, r.train_seconds);
    } else {
      spdlog::info("final test accuracy: {:.2f}% (loss {:.4f}) after {} steps in {:.1f} s",
                   100.0 * r.test_accuracy, r.test_loss, r.steps, r.train_seconds);
    }
    return 0;
  } catch (...) {
    // A configuration error here is a component's refusal of its options, or a world that
    // cannot run the pipeline: found while the run was built, before its first step.
    return report_failure();
  }
}

int evaluate(const PipelineArgs& given, const std::string& checkpoint, const std::string& weights,
             const std::string& metrics_path) {
  PipelineArgs args = given;
  // Only the evaluation split is used; TensorBoard and the profiler would open a run folder.
  args.overrides.insert(args.overrides.end(), {"run.eval=true", "run.tensorboard=false",
                                               "run.profile_steps=0", "run.checkpoint_best=none"});
  if (!weights.empty())
    args.overrides.push_back("model.init=" + config::quote_toml_string(weights));
  Plugins plugins;
  config::Pipeline pipeline;
  int code = 0;
  if (!resolve(args, plugins, pipeline, code, /*preflight_world=*/0)) return code;
  engine::RunOptions options;
  options.metrics_path = metrics_path;
  options.process.torch_settings = true;
  if (checkpoint == "auto") {
    // Found before the model and the data are built. The trainer still picks the checkpoint
    // itself, so that a damaged newest one falls back to the one before, as a resumed run does.
    if (const std::string output = engine::output_dir(pipeline);
        io::newest_checkpoint_in(output).empty()) {
      fmt::print(stderr, "--checkpoint auto: no checkpoint under the pipeline's output folder {}\n",
                 output);
      return kConfigError;
    }
    options.resume = checkpoint;
  } else if (!checkpoint.empty()) {
    options.resume = io::newest_checkpoint_in(checkpoint);
    if (options.resume.empty()) {
      fmt::print(stderr,
                 "--checkpoint {}: no checkpoint here (a checkpoint folder, a run folder with "
                 "checkpoints/, or an output folder with version_<N> run folders)\n",
                 checkpoint);
      return kConfigError;
    }
  } else if (pipeline.settings.model.init.empty()) {
    fmt::print(stderr,
               "{}: nothing to evaluate: give --checkpoint DIR (or auto), --weights FILE, or "
               "set model.init\n",
               given.file);
    return kConfigError;
  }
  // The trainer's own lines speak of a run (its folder, its steps); warnings still show, and
  // -v shows everything.
  const spdlog::level::level_enum level = spdlog::get_level();
  if (level == spdlog::level::info) spdlog::set_level(spdlog::level::warn);
  struct RestoreLevel {
    spdlog::level::level_enum level;
    ~RestoreLevel() { spdlog::set_level(level); }
  } restore{level};
  try {
    engine::Trainer trainer(pipeline, options);
    const io::EvalRecord r = trainer.evaluate();
    const std::string metrics = !r.multi_label
                                    ? fmt::format("test accuracy {:.2f}%, top-5 {:.2f}%",
                                                  100.0 * r.accuracy, 100.0 * r.accuracy_top5)
                                    : fmt::format("test mAP {:.2f}%", 100.0 * r.map);
    fmt::print("{}, loss {:.4f} ({}{})\n", metrics, r.loss, r.averaged ? "the EMA weights of " : "",
               options.resume.empty() ? "model.init " + pipeline.settings.model.init
               : checkpoint == "auto" ? fmt::format("the newest checkpoint, step {}", r.step)
                                      : fmt::format("{}, step {}", options.resume, r.step));
    return 0;
  } catch (...) {
    return report_failure();
  }
}

int plot(const std::string& metrics, const std::string& png) {
  try {
    io::plot_metrics(metrics, png);
  } catch (...) {
    return report_failure();
  }
  fmt::print("wrote {}\n", png);
  return 0;
}

int export_weights(const std::string& from, const std::string& to, const std::string& dtype,
                   bool ema) {
  try {
    // A checkpoint folder, or the newest checkpoint of a run folder or an output folder.
    const std::string checkpoint = io::newest_checkpoint_in(from);
    if (checkpoint.empty()) {
      throw std::runtime_error(from +
                               ": no checkpoint here (a checkpoint folder, a run folder with "
                               "checkpoints/, or an output folder with version_<N> run folders)");
    }
    if (checkpoint != from)
      spdlog::info("exporting {}, the newest checkpoint in {}", checkpoint, from);
    // The whole checkpoint is verified, so a corrupt one is refused rather than exported.
    io::CheckpointData data = io::read_checkpoint(checkpoint);
    if (ema) {
      // The weights' moving average, under the model's names (engine/model_ema).
      data.model = engine::saved_average(data);
      if (data.model.empty()) {
        throw std::runtime_error(checkpoint +
                                 ": --ema: the checkpoint holds no moving average of the weights "
                                 "(its run had ema.decay = 0)");
      }
    }
    // An optimizer that evaluates other weights than it trains (Schedule-Free's x) left them in
    // the checkpoint: those are the model's weights to ship, as evaluation measured them.
    std::string weights = ema ? "ema" : "trained";
    if (!ema) {
      const auto evaluation = engine::saved_eval_weights(data);
      if (!evaluation.empty()) {
        std::map<std::string, at::Tensor> by_name(evaluation.begin(), evaluation.end());
        for (auto& [name, t] : data.model) {
          const auto it = by_name.find(name);
          if (it != by_name.end()) t = it->second.to(t.scalar_type());
        }
        weights = "evaluation";
        spdlog::info("exporting the optimizer's evaluation weights ({} tensors)", by_name.size());
      }
    }
    const at::ScalarType target = dtype == "fp16"   ? at::kHalf
                                  : dtype == "bf16" ? at::kBFloat16
                                                    : at::kFloat;
    for (auto& [name, t] : data.model) {
      if (dtype != "keep" && t.is_floating_point()) t = t.to(target);
    }
    io::write_safetensors(to, data.model,
                          {{"format", "pt"},
                           {"source", checkpoint},
                           {"step", std::to_string(data.info.step)},
                           {"weights", weights}});
    fmt::print("{}: {} {}tensors from {} (step {}), {}\n", to, data.model.size(),
               ema ? "moving-average " : "", checkpoint, data.info.step,
               dtype == "keep" ? "dtypes as trained" : dtype);
    return 0;
  } catch (...) {
    return report_failure();
  }
}

int validate(const PipelineArgs& args, int64_t world_size) {
  Plugins plugins;
  config::Pipeline pipeline;
  int code = 0;
  std::string data;
  if (!resolve(args, plugins, pipeline, code, world_size, &data)) return code;
  fmt::print("{}: ok (model {}, optimizer {}, lr_policy {}, norm {}, precision {}{})\n{}\n",
             args.file, pipeline.model.component->name(), pipeline.optimizer.component->name(),
             pipeline.lr_policy.component->name(), pipeline.norm.component->name(),
             pipeline.precision.component->name(),
             world_size > 1 ? fmt::format("; {} ranks", world_size) : std::string(), data);
  return 0;
}

int plan(const PipelineArgs& args) {
  Plugins plugins;
  config::Pipeline pipeline;
  int code = 0;
  if (!resolve(args, plugins, pipeline, code)) return code;
  try {
    fmt::print("{}", engine::describe_plan(pipeline));
    return 0;
  } catch (...) {
    return report_failure();
  }
}

int loader_bench(const PipelineArgs& args, int64_t batches, int64_t warmup) {
  Plugins plugins;
  config::Pipeline pipeline;
  int code = 0;
  if (!resolve(args, plugins, pipeline, code, /*preflight_world=*/0)) return code;
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  try {
    const config::DataSettings& d = pipeline.settings.data;
    const uint64_t seed = pipeline.settings.run.seed;
    const auto opened = Clock::now();
    // The training split alone: a folder without a validation split times as well.
    const std::shared_ptr<const data::Source> train =
        engine::as_config_errors(pipeline, [&] { return engine::open_train_split(pipeline); });
    const auto built = Clock::now();
    // The training loader as rank 0 of a one-process CPU run builds it.
    const data::LoaderOptions options =
        engine::loader_options(d, seed, /*train=*/true, at::kCPU, /*rank=*/0, /*world_size=*/1);
    data::Loader loader(*train, options);
    int64_t epoch = 0, taken = 0, images = 0;
    double first = 0.0;
    Clock::time_point measured{};
    loader.start_epoch(epoch);
    while (taken < warmup + batches) {
      std::optional<data::Batch> batch = loader.next();
      if (!batch) {
        loader.start_epoch(++epoch);
        continue;
      }
      ++taken;
      if (taken == 1) first = seconds(built, Clock::now());
      if (taken == warmup) measured = Clock::now();
      if (taken > warmup) images += batch->images.size(0);
    }
    if (warmup == 0) measured = built;
    const double elapsed = seconds(measured, Clock::now());
    fmt::print(
        "{{\"images_per_s\": {:.2f}, \"first_batch_s\": {:.4f}, \"open_s\": {:.4f}, "
        "\"batches\": {}, \"batch_size\": {}, \"workers\": {}, \"skipped_samples\": {}}}\n",
        images / elapsed, first, seconds(opened, built), batches, options.batch_size,
        options.workers, loader.skipped_samples());
    return 0;
  } catch (...) {
    return report_failure();
  }
}

int lr_schedule(const PipelineArgs& args, int64_t iters, bool csv, const std::string& png,
                const std::string& metrics) {
  Plugins plugins;
  config::Pipeline pipeline;
  int code = 0;
  if (!resolve(args, plugins, pipeline, code)) return code;
  try {
    engine::LrTable table = engine::lr_table(pipeline, iters, metrics);
    if (!table.note.empty()) fmt::print(stderr, "# {}\n", table.note);
    fmt::print("{}", engine::format_lr_table(table, csv));
    if (!png.empty()) {
      engine::plot_lr_table(table, png);
      fmt::print(stderr, "wrote {}\n", png);
    }
    return 0;
  } catch (...) {
    return report_failure();
  }
}

int config_docs() {
  // Built-in plugins only, so the reference does not depend on KILN_PLUGIN_PATH.
  plugin::LibraryLoader loader(plugin::host_api());
  std::vector<std::string> refused;
  plugin::Registry registry = plugin::load_all(loader, {plugin::builtin_plugin_dir()}, refused);
  print_refused(refused);
  fmt::print("{}", config::reference_markdown(registry));
  return refused.empty() ? 0 : kPluginRefused;
}

int plugins_list(const std::vector<std::string>& extra_dirs) {
  Plugins plugins = load_plugins(extra_dirs);
  fmt::print("{:<16} {:<10} {:<8} {}\n", "NAME", "KIND", "VERSION", "PATH");
  for (const auto& c : plugins.registry.all()) {
    const auto& v = c.descriptor->version;
    fmt::print("{:<16} {:<10} {:<8} {}\n", c.name(), plugin::kind_name(c.kind()),
               fmt::format("{}.{}.{}", v.major, v.minor, v.patch), c.library_path);
  }
  print_refused(plugins.refused);
  return plugins.refused.empty() ? 0 : kPluginRefused;
}

int plugins_describe(const std::string& name, const std::vector<std::string>& extra_dirs) {
  Plugins plugins = load_plugins(extra_dirs);
  const plugin::Component* c = plugins.registry.find_any(name);
  if (c == nullptr) {
    std::vector<std::string> names;
    for (const auto& other : plugins.registry.all()) names.emplace_back(other.name());
    fmt::print(stderr, "error: no plugin component named '{}'; available: {}\n", name,
               fmt::join(names, ", "));
    return kConfigError;
  }
  const auto* d = c->descriptor;
  fmt::print("{} ({}) {}.{}.{}\n", c->name(), plugin::kind_name(c->kind()), d->version.major,
             d->version.minor, d->version.patch);
  if (d->summary != nullptr) fmt::print("  {}\n", d->summary);
  fmt::print("  library:      {}\n", c->library_path);
  // The ABI the library was built for (older minors load; the host reads what they filled).
  fmt::print("  plugin:       {} {}.{}.{}, abi {}.{}\n", c->plugin->name, c->plugin->version.major,
             c->plugin->version.minor, c->plugin->version.patch, c->plugin->abi_major,
             c->plugin->abi_minor);
  fmt::print("  capabilities: {}\n", caps_text(d->capabilities->flags));
  // What an optimizer's vtable (ABI 1.14) offers beyond step.
  if (c->kind() == KILN_COMPONENT_OPTIMIZER) {
    std::vector<std::string> slots;
    if (plugin::has_eval_weights(*c)) slots.emplace_back("evaluation weights (eval_weights)");
    if (plugin::steps_all_groups(*c)) {
      slots.emplace_back("whole step with re-evaluation (step_all)");
    }
    if (!slots.empty()) fmt::print("  steps:        {}\n", fmt::join(slots, ", "));
  }
  // What an LR policy's vtable (ABI 1.15) offers beyond lr_at.
  if (c->kind() == KILN_COMPONENT_LR_POLICY) {
    std::vector<std::string> slots;
    if (plugin::observes_evaluations(*c)) slots.emplace_back("reacts to evaluations (observe)");
    if (plugin::keeps_lr_state(*c)) slots.emplace_back("checkpointed state (get_state, set_state)");
    if (!slots.empty()) fmt::print("  schedule:     {}\n", fmt::join(slots, ", "));
  }
  for (size_t i = 0; i < d->capabilities->attribute_count; ++i) {
    fmt::print("  {}: {}\n", d->capabilities->attributes[i].name,
               d->capabilities->attributes[i].value);
  }
  if (c->plugin->torch_version != nullptr) {
    fmt::print("  torch:        {} (C++11 ABI {})\n", c->plugin->torch_version,
               c->plugin->torch_cxx11_abi);
  }
  fmt::print("  options:{}\n", d->option_count == 0 ? " none" : "");
  for (size_t i = 0; i < d->option_count; ++i) {
    const kiln_option_spec& o = d->options[i];
    std::string range = config::bounds_text(o);
    if (!range.empty()) range = " " + range;
    if (o.choices != nullptr) range += fmt::format(" one of: {}", o.choices);
    fmt::print("    {:<18} {:<11} default {:<10}{}  {}\n", o.name, config::option_type_name(o.type),
               o.default_value != nullptr ? o.default_value : "(required)", range,
               o.doc != nullptr ? o.doc : "");
  }
  return 0;
}

}  // namespace kiln::cli
