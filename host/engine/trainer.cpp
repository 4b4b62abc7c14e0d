// The training loop, top to bottom: build the components (Impl::build), take one optimizer step
// over a window of micro-batches (Impl::step: forward, loss, backward, the optimizer, log,
// checkpoints), and run them epoch after epoch with an evaluation at each end (Trainer::run).
#include "engine/trainer.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/tensor.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/filesystem.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <stdexcept>
#include <tuple>

#include "data/dataset.hpp"
#include "data/loader.hpp"
#include "dist/data_parallel.hpp"
#include "dist/heartbeat.hpp"
#include "dist/process_group.hpp"
#include "engine/activation_checkpoint.hpp"
#include "engine/checks.hpp"
#include "engine/gradients.hpp"
#include "engine/graph_step.hpp"
#include "engine/loss_scaler.hpp"
#include "engine/lr_driver.hpp"
#include "engine/memory_format.hpp"
#include "engine/model_build.hpp"
#include "engine/optimizer_step.hpp"
#include "engine/param_groups.hpp"
#include "engine/precision.hpp"
#include "engine/resume.hpp"
#include "engine/run_data.hpp"
#include "engine/stop_signal.hpp"
#include "engine/torch_settings.hpp"
#include "io/heap.hpp"
#include "io/memory.hpp"
#include "io/metrics.hpp"
#include "io/progress.hpp"
#include "io/run_folder.hpp"
#include "io/safetensors.hpp"
#include "io/status_line.hpp"
#include "io/tensorboard.hpp"
#include "kiln/torch.hpp"
#include "plugin/adapters.hpp"
#include "plugin/host_api.hpp"
#include "plugin/norm_layer.hpp"

namespace kiln::engine {
namespace {

using Clock = std::chrono::steady_clock;

// A batch tensor on the run's device: asynchronous from the loader's pinned memory; a tensor
// already there is taken as it is, without a call through the dispatcher.
at::Tensor on_device(const at::Tensor& t, const c10::Device& device) {
  return t.device() == device ? t : t.to(device, /*non_blocking=*/true);
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Evaluation {
  double accuracy = 0.0, loss = 0.0;
};

// Test-set accuracy and loss, the forward run as in training (dtype, autocast). In a
// distributed run each rank evaluates its shard and the sums are all-reduced.
Evaluation evaluate_model(kiln::Model& model, data::Loader& loader, at::Device device,
                          const PrecisionPlan& plan, bool channels_last,
                          dist::ProcessGroup* group) {
  at::NoGradGuard no_grad;
  model.eval();
  loader.start_epoch(0);
  // Sums stay on the device until the end: no host sync per batch.
  at::Tensor loss_total, correct_total;
  int64_t seen = 0;
  while (auto batch = loader.next()) {
    at::Tensor x = on_device(batch->images, device);
    at::Tensor y = on_device(batch->labels, device);
    if (plan.half_model()) x = x.to(plan.model_dtype);
    x = in_model_layout(x, channels_last);
    at::Tensor logits;
    {
      AutocastScope autocast(device.type(), plan.autocast_dtype, plan.autocast);
      logits = model.forward(x).to(at::kFloat);
    }
    at::Tensor loss = at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).to(at::kDouble);
    at::Tensor correct = logits.argmax(1).eq(y).sum();
    loss_total = loss_total.defined() ? loss_total + loss : loss;
    correct_total = correct_total.defined() ? correct_total + correct : correct;
    seen += y.size(0);
  }
  model.train();
  double loss_sum = loss_total.defined() ? loss_total.item<double>() : 0.0;
  int64_t correct = correct_total.defined() ? correct_total.item<int64_t>() : 0;
  if (group != nullptr) {
    at::Tensor sums = at::tensor(
        std::vector<double>{loss_sum, static_cast<double>(correct), static_cast<double>(seen)});
    group->allreduce(sums, "sum");
    loss_sum = sums[0].item<double>();
    correct = static_cast<int64_t>(sums[1].item<double>());
    seen = static_cast<int64_t>(sums[2].item<double>());
  }
  return {seen ? static_cast<double>(correct) / seen : NAN, seen ? loss_sum / seen : NAN};
}

// The output folder: run.output_dir, or runs/<pipeline file name>. Each run writes into a run
// folder of its own under it (io/run_folder).
std::string output_dir(const config::Pipeline& p) {
  std::string dir = p.run.get_string("output_dir");
  if (!dir.empty()) return dir;
  std::string stem = boost::filesystem::path(p.path).stem().string();
  return "runs/" + (stem.empty() ? std::string("kiln") : stem);
}

// The model's parameters and buffers by name, as a safetensors file in `dir`.
std::string save_weights(torch::nn::Module& model, const std::string& dir, int64_t step,
                         const std::string& reason) {
  boost::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : model.named_parameters()) tensors.emplace_back(item.key(), item.value());
  for (const auto& item : model.named_buffers()) tensors.emplace_back(item.key(), item.value());
  const std::string path = dir + "/weights-step-" + std::to_string(step) + ".safetensors";
  io::write_safetensors(path, tensors, {{"step", std::to_string(step)}, {"stopped", reason}});
  return path;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

// Everything a run holds, in the order it is built (and torn down in reverse): the process
// group, precision, data, model, optimizer, schedule, loss scale, data parallelism, outputs;
// then where the loop is.
struct Trainer::Impl {
  const config::Pipeline& p;
  RunOptions options;
  at::Device device{at::kCPU};
  std::unique_ptr<dist::ProcessGroup> group;  // null in a single-process run
  std::unique_ptr<dist::Heartbeat> heartbeat;
  int rank = 0, world = 1;
  uint64_t seed = 0;

  std::optional<plugin::PrecisionAdapter> precision;
  PrecisionPlan plan;
  data::Dataset train_set, test_set;
  std::optional<data::Loader> train_loader, test_loader;
  std::shared_ptr<kiln::Model> model;
  // Where the norm layers are in a step's micro-batches, when norm.running_stats_update has
  // the host move their running statistics (accumulation only); null otherwise.
  std::shared_ptr<plugin::NormWindow> norm_window;
  bool channels_last = false;  // 4-D weights and batches in NHWC (model.memory_format)
  std::vector<ParamGroup> groups;
  std::optional<plugin::OptimizerAdapter> optimizer;
  int64_t epochs = 0, accumulation = 1, batches_per_epoch = 0;
  ScheduleFrame frame;
  std::optional<plugin::LrPolicyAdapter> lr_policy;
  std::optional<LrDriver> lr_driver;
  std::optional<LossScaler> scaler;
  std::optional<OptimizerStep> optimizer_step;
  std::unique_ptr<dist::DataParallel> ddp;
  std::unique_ptr<GraphedStep> graphed;  // run.cuda_graph, where the pipeline allows it
  bool sync_every_micro_step = false;

  RunResult result;
  // This run's folder (io/run_folder). A new one is created by the first write (written_run_dir):
  // a run that writes nothing (checkpoints and TensorBoard off) leaves no empty folder.
  io::RunFolder folder;
  bool writer = true;  // rank 0 alone writes checkpoints, metrics, TensorBoard and weights
  int64_t checkpoint_every = 0, checkpointed_step = -1, log_interval = 1;
  // The gradient pass on every step (run.grad_check), else on logged steps only.
  bool check_every_step = true;
  std::unique_ptr<io::TensorBoardWriter> tensorboard;
  std::optional<io::MetricsWriter> metrics;

  // ---- where the loop is ----
  TrainerState state = TrainerState::kReady;
  RunPosition position;      // the next step's place: epoch and batches of it already consumed
  RunPosition last;          // where the run is after its latest step (what a checkpoint saves)
  bool epoch_open = false;   // the loader has started position.epoch
  bool epoch_ended = false;  // the latest step finished its epoch
  int64_t step_epoch = 0;    // the epoch of the latest step
  bool eval_due = false;     // resumed at an epoch's last step: its evaluation is still to come
  int64_t first_step = 0;    // steps done before this process began (a resume): the ETA's base
  bool bar = false;          // a progress bar on the terminal's status line
  Clock::time_point bar_drawn_at;
  Clock::time_point start;
  double window_loss = 0.0, window_samples = 0.0;
  Clock::time_point window_start;
  std::atomic<bool> cancel_requested{false};

  Impl(const config::Pipeline& pipeline, const RunOptions& run_options);
  void join_group();
  void build();
  void step();
  io::EvalRecord evaluate();
  void checkpoint(const RunPosition& at, bool even_if_off = false);
  const std::string& written_run_dir();
  // Erases the progress bar, when one is shown: the run's end and the caller's lines after it
  // start on a clean line. (Log lines erase it themselves: io/log.)
  void clear_bar() {
    if (bar) options.status_line->clear();
  }
  void end_epoch();
  void finish();
  // Whether optimizer step `step` gets a progress line.
  bool logged(int64_t step) const { return step % log_interval == 0 || step == frame.max_iters; }
  // Runs `f`; in a distributed run a failure names the rank to blame, not only a closed socket.
  template <typename F>
  auto blame(F&& f) -> decltype(f());
};

Trainer::Impl::Impl(const config::Pipeline& pipeline, const RunOptions& run_options)
    : p(pipeline), options(run_options) {
  // Before any tensor the run keeps: the metrics' tensor_* fields come from this counter.
  if (options.process.count_cpu_memory) io::count_cpu_tensor_memory();
  if (options.process.torch_settings) {
    apply_torch_settings(p.run);
  } else {
    report_torch_settings_left(p.run);
  }
  // What the configuration cannot do is refused before the process group forms; a component's
  // refusal of its options while the run is built is a configuration error too.
  as_config_errors(p, [&] {
    device = resolve_device(p.run.get_string("device"));
    check_pipeline(p, device, options.launch ? options.launch->world_size : 1);
  });
  join_group();
  blame([&] { as_config_errors(p, [&] { build(); }); });
  // Once the set-up is done, not before: its large buffers (the decoded test split) are then
  // mapped apart instead of lying among the small blocks every step frees and takes again, which
  // cost a tiny model's steps 9 % more malloc work (callgrind; docs/speed.md).
  if (options.process.tune_heap) io::tune_heap_for_training();
}

// Every rank of a distributed run joins the process group before anything else.
void Trainer::Impl::join_group() {
  if (!options.launch) return;
  const dist::LaunchEnv& env = *options.launch;
  if (device.is_cuda()) {
    // One GPU per local rank, among those CUDA_VISIBLE_DEVICES leaves visible.
    device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
    c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(device);
  }
  dist::GroupOptions g;
  const std::string backend = p.dist.get_string("backend");
  g.backend = backend != "auto" ? backend : device.is_cuda() ? "nccl" : "gloo";
  g.master_addr = env.master_addr;
  g.port = env.master_port;
  g.rank = env.rank;
  g.world_size = env.world_size;
  g.device_index = env.local_rank;
  g.agent_store = env.agent_store;
  g.run_id = env.run_id;
  g.restart_count = env.restart_count;
  g.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(1000.0 * p.dist.get_float("timeout_s")));
  group = std::make_unique<dist::ProcessGroup>(g);
  heartbeat = std::make_unique<dist::Heartbeat>(group->store(), env.rank, env.world_size);
  rank = env.rank;
  world = env.world_size;
  spdlog::info("rank {} of {} joined the {} group at {}:{} ({})", rank, world, g.backend,
               env.master_addr, env.master_port, env.source);
}

template <typename F>
auto Trainer::Impl::blame(F&& f) -> decltype(f()) {
  if (!group) return f();
  try {
    return f();
  } catch (const config::ConfigError&) {
    throw;  // every rank has the same configuration and refuses it alike
  } catch (const std::exception& e) {
    throw std::runtime_error(
        fmt::format("rank {}: {}\n  ranks: {}", group->rank(), e.what(), heartbeat->diagnose()));
  }
}

// ---- set-up: data, model, optimizer, schedule, loss scale, data parallelism, outputs ---------
void Trainer::Impl::build() {
  const auto& run = p.run;
  seed = static_cast<uint64_t>(run.get_int("seed"));
  at::manual_seed(seed);
  precision.emplace(*p.precision.component, p.precision.options, device.type());
  plan = plan_precision(precision->policy(), precision->name());

  std::tie(train_set, test_set) = load_data(p.data, seed);
  train_loader.emplace(train_set, loader_options(p.data, seed, true, device, rank, world));
  test_loader.emplace(test_set, loader_options(p.data, seed, false, device, rank, world));

  // The model, with the pipeline's norm plugin behind every norm layer.
  norm_window = norm_window_for(p);
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  input.channels = train_set.images.size(1);
  input.height = train_set.images.size(2);
  input.width = train_set.images.size(3);
  input.num_classes = train_set.num_classes;
  // Synced norm layers and the optimizer reach the run's group through their calls' contexts.
  model = build_model(p, input, world, norm_window, group.get());
  if (const std::string& init = p.model.core.get_string("init"); !init.empty()) {
    try {
      load_weights(*model, init);
    } catch (const std::exception& e) {
      throw PipelineError("model.init", e.what());
    }
  }
  const std::string checkpointing = apply_activation_checkpointing(
      *model, p.memory.get_string_list("checkpoint"), std::string(p.model.component->name()));
  if (!checkpointing.empty()) spdlog::info("activation checkpointing: {}", checkpointing);
  model->to(device);
  cast_model(*model, plan);
  check_model_precision(*model, plan);
  channels_last = use_channels_last(p.model.core.get_string("memory_format"), device, plan, *model);
  if (channels_last) {
    spdlog::info("memory format channels_last: {} 4-D tensors restrided, batches follow",
                 to_channels_last(*model));
  }
  model->train();

  // Optimizer, schedule, loss scale.
  groups = build_param_groups(*model, group_rules(p));
  optimizer.emplace(*p.optimizer.component, p.optimizer.options, group.get());
  epochs = run.get_int("epochs");
  accumulation = run.get_int("accumulation_steps");
  batches_per_epoch = train_loader->batches_per_epoch();
  frame = schedule_frame(p, batches_per_epoch);
  lr_policy.emplace(*p.lr_policy.component, p.lr_policy.options, to_policy_schedule(frame));
  lr_driver.emplace(frame, *lr_policy);
  scaler.emplace(plan, *precision, run.get_int("max_nonfinite_steps"));
  ClipSettings clip;
  clip.max_norm = p.optimizer.core.get_float("clip_grad_norm");
  clip.norm_type = p.optimizer.core.get_float("clip_norm_type");
  clip.max_value = p.optimizer.core.get_float("clip_grad_value");
  optimizer_step.emplace(groups, plan, *optimizer, *scaler, *lr_driver, clip);

  // The run's folder (io/run_folder), and resume.
  folder = io::choose_run_folder(output_dir(p), options.resume);
  if (rank == 0 && !folder.is_new) {
    spdlog::info("run folder {} ({})", folder.path, folder.why);
    const io::CheckpointRootScan scan = io::clean_checkpoint_root(folder.path + "/checkpoints");
    for (const std::string& partial : scan.removed_partial) {
      spdlog::info("removed {}: a checkpoint whose write was interrupted", partial);
    }
    for (const std::string& stray : scan.ignored) {
      spdlog::warn("{}: not a checkpoint (checkpoints are step-<N> folders); ignored", stray);
    }
  }
  if (!options.resume.empty()) {
    std::string chosen;
    if (auto data = choose_checkpoint(options.resume, folder.path + "/checkpoints", p,
                                      run.get_string("resume_fallback") == "previous", &chosen)) {
      position = restore(*data, *model, *optimizer_step, *optimizer, *lr_driver, *scaler, device);
      spdlog::info("resumed from {}: step {}, epoch {}, batch {}", chosen, position.step,
                   position.epoch, position.batches_in_epoch);
    }
  }
  last = position;
  first_step = position.step;
  checkpointed_step = position.step > 0 ? position.step : -1;
  // Ranks draw different dropout masks; the weights above were drawn alike (and are
  // broadcast from rank 0 below anyway).
  if (world > 1 && options.resume.empty()) at::manual_seed(seed + static_cast<uint64_t>(rank));

  // Data parallelism.
  sync_every_micro_step = p.dist.get_bool("sync_every_micro_step");
  if (group) {
    std::vector<at::Tensor> params, buffers;
    for (const auto& t : model->parameters()) {
      if (t.requires_grad()) params.push_back(t);
    }
    for (const auto& t : model->buffers()) buffers.push_back(t);
    dist::DataParallelOptions d;
    d.bucket_cap_mb = p.dist.get_float("bucket_cap_mb");
    d.find_unused_parameters = p.dist.get_bool("find_unused_parameters");
    d.broadcast_buffers = p.dist.get_bool("broadcast_buffers");
    d.compression = p.dist.get_string("gradient_compression");
    d.gradient_as_bucket_view = p.dist.get_bool("gradient_as_bucket_view");
    ddp = std::make_unique<dist::DataParallel>(*group, params, buffers, d);
    spdlog::info("data parallel over {} ranks: gradient buckets of up to {} MiB{}", world,
                 d.bucket_cap_mb,
                 d.compression == "none" ? "" : ", " + d.compression + " on the wire");
  }

  // CUDA graph of the step.
  if (run.get_bool("cuda_graph")) {
    GraphConditions conditions;
    conditions.cuda = device.is_cuda();
    conditions.world_size = world;
    conditions.accumulation = accumulation;
    conditions.master_weights = plan.master_weights;
    conditions.activation_checkpointing = !checkpointing.empty();
    const std::string why_not = graph_unsupported_reason(conditions);
    if (!why_not.empty()) {
      spdlog::warn("run.cuda_graph: {}; the step runs eagerly", why_not);
    } else {
      std::vector<at::Tensor> trainable;
      for (const auto& g : groups)
        trainable.insert(trainable.end(), g.params.begin(), g.params.end());
      graphed =
          std::make_unique<GraphedStep>(*model, std::move(trainable), plan, clip.norm_type, device);
      if (optimizer_step->capturable()) {
        graphed->set_update([this](const at::Tensor& readout) {
          optimizer_step->enqueue_update(position.step + 1, readout);
        });
        spdlog::info(
            "run.cuda_graph: forward, backward, the check, clipping and the optimizer are "
            "captured after {} eager steps",
            GraphedStep::kWarmupSteps);
      } else {
        spdlog::info(
            "run.cuda_graph: forward, backward and the check are captured after {} eager steps; "
            "optimizer '{}' is not capturable (KILN_CAP_CAPTURABLE), so it runs after each "
            "replay",
            GraphedStep::kWarmupSteps, optimizer->name());
      }
    }
  }

  // Outputs: checkpoints, signals, TensorBoard, metrics. The ranks hold the same state, so
  // rank 0's copy is the run's.
  writer = rank == 0;
  checkpoint_every = run.get_int("checkpoint_every");
  log_interval = run.get_int("log_interval");
  // Loss scaling, clipping and half-precision gradients need the pass to step safely, and data
  // parallel ranks must agree on a skip from the same (all-reduced) gradients, not their own
  // losses.
  check_every_step = run.get_string("grad_check") == "every_step" ||
                     plan.loss_scaling != KILN_SCALE_NONE || plan.half_model() || ddp != nullptr ||
                     clip.any();
  if (writer && run.get_bool("tensorboard")) {
    tensorboard = std::make_unique<io::TensorBoardWriter>(written_run_dir() + "/tensorboard");
    // What the interrupted run logged after its checkpoint is redone here: TensorBoard drops it.
    if (position.step > 0) tensorboard->session_start(position.step + 1);
  }
  metrics.emplace(writer ? options.metrics_path : std::string(), /*append=*/position.step > 0);
  std::vector<std::string> group_names;
  for (const ParamGroup& g : groups) group_names.push_back(g.name);
  metrics->set_lr_groups(group_names);

  size_t trainable = 0;
  for (const auto& g : groups) trainable += g.params.size();
  spdlog::info("training {} ({} parameter tensors in {} group(s)) on {} for {} steps of {} samples",
               std::string(p.model.component->name()), trainable, groups.size(), device.str(),
               frame.max_iters, frame.effective_batch);
  if (plan.half_model() || plan.autocast || plan.loss_scaling != KILN_SCALE_NONE) {
    spdlog::info("precision {}: model {}{}{}{}{}", plan.name, dtype_name(plan.model_dtype),
                 plan.half_model() && plan.norm_fp32 ? " (norm layers float32)" : "",
                 plan.autocast ? ", autocast " + dtype_name(plan.autocast_dtype) : "",
                 plan.master_weights ? ", float32 master weights" : "",
                 plan.loss_scaling == KILN_SCALE_DYNAMIC
                     ? fmt::format(", dynamic loss scale from {}", plan.initial_scale)
                 : plan.loss_scaling == KILN_SCALE_STATIC
                     ? fmt::format(", static loss scale {}", plan.initial_scale)
                     : "");
  }
  if (plan.model_dtype == at::kHalf && !plan.autocast && device.is_cpu()) {
    spdlog::warn(
        "precision '{}' runs a float16 model on the CPU, where float16 kernels are slow; "
        "bfloat16 (precision option dtype = \"bf16\") is the CPU's half type",
        plan.name);
  }
  if (frame.base_lr != frame.unscaled_lr) {
    spdlog::info("lr scaled linearly: {} x {} / {} = {}", frame.unscaled_lr, frame.effective_batch,
                 p.lr_scaling.get_int("base_batch"), frame.base_lr);
  }

  result.test_accuracy = NAN;
  result.steps = position.step;
  start = window_start = Clock::now();
  bar = writer && options.status_line != nullptr && io::stderr_is_terminal();
  // A run resumed at its very end (or with nothing to do) has no step left.
  if (position.step >= frame.max_iters || position.epoch > epochs) {
    state = TrainerState::kFinished;
  } else if (position.batches_in_epoch >= batches_per_epoch) {
    // A checkpoint taken at an epoch's last step: the next step opens the next epoch, and the
    // evaluation the stopped run did not reach comes first (Trainer::run).
    epoch_ended = eval_due = true;
    step_epoch = position.epoch;
    end_epoch();
  }
}

void Trainer::Impl::checkpoint(const RunPosition& at, bool even_if_off) {
  if (!writer || (!even_if_off && !p.run.get_bool("checkpoints")) || at.step == checkpointed_step)
    return;
  // Every step the checkpoint covers has its metrics line and TensorBoard events on disk: a
  // resumed run starts after them.
  if (metrics) metrics->flush();
  if (tensorboard) tensorboard->flush();
  result.last_checkpoint =
      io::write_checkpoint(written_run_dir() + "/checkpoints",
                           capture(at, *model, *optimizer_step, *optimizer, *lr_driver, *scaler, p),
                           p.run.get_int("checkpoint_keep"));
  checkpointed_step = at.step;
  spdlog::info("checkpoint {}", result.last_checkpoint);
}

// The run folder, created now when it is a new one: the next free number then, so that two runs
// starting together in one output folder never share one.
const std::string& Trainer::Impl::written_run_dir() {
  if (folder.is_new) {
    folder.path = io::create_run_folder(output_dir(p));
    folder.is_new = false;
    spdlog::info("run folder {} ({})", folder.path, folder.why);
  }
  return folder.path;
}

// ---- one optimizer step ------------------------------------------------------------------------
void Trainer::Impl::step() {
  if (state != TrainerState::kReady) throw std::logic_error("the run has no step left");
  eval_due = false;
  const int64_t max_steps = frame.max_iters;
  // A stop asked for between steps (cancel, an observer) is honoured before any work.
  if (cancel_requested.load() && !group) {
    spdlog::info("cancelled: stopping after step {}", position.step);
    if (last.step > 0) checkpoint(last);
    state = TrainerState::kCancelled;
    return;
  }
  if (!epoch_open) {
    // A resumed run continues its epoch at the batch after the checkpoint.
    train_loader->start_epoch(position.epoch - 1, position.batches_in_epoch);
    epoch_open = true;
  }
  const int64_t epoch = position.epoch;
  // One optimizer step over a window of micro-batches; the last window of an epoch may be
  // shorter and is averaged over its own length. The loss scale is fixed inside the window.
  const int64_t window = std::min(accumulation, batches_per_epoch - position.batches_in_epoch);
  const double scale = scaler->scale();
  // The step's time runs from here: zero_grad is part of it, as in a Python loop.
  const auto step_start = Clock::now();
  // A graphed step keeps its gradient buffers (GraphedStep drops or zeroes them itself).
  if (!graphed) optimizer_step->zero_grad();
  io::reset_peak_tensor_memory(device);
  const int64_t resting_bytes = io::tensor_memory(device).current_bytes;
  const int64_t allreduces_before = ddp ? ddp->allreduce_calls() : 0;
  double data_time = 0.0;
  // The window's loss on the device, read back once, with the gradient check: a window of one
  // keeps its mean loss as it is (a multiply per step would buy nothing); longer windows sum
  // loss × batch size.
  at::Tensor loss_sum;
  std::optional<GradCheck> graphed_check;  // the check GraphedStep read back
  bool update_ran = false;                 // and whether its replay ran the optimizer
  int64_t samples = 0, micro = 0;
  if (norm_window) norm_window->begin(window);
  for (; micro < window; ++micro) {
    const auto fetch_start = Clock::now();
    std::optional<data::Batch> batch = train_loader->next();
    data_time += seconds_since(fetch_start);
    if (!batch) break;
    at::Tensor x = batch->images.to(device, /*non_blocking=*/true);
    at::Tensor y = batch->labels.to(device, /*non_blocking=*/true);
    if (plan.half_model()) x = x.to(plan.model_dtype);
    x = in_model_layout(x, channels_last);
    if (graphed) {
      // The step as one graph (accumulation is 1: a window of one). It is captured only once
      // the optimizer has applied a step, so that its state exists outside the graph.
      if (optimizer_step->capturable()) optimizer_step->set_device_lrs();
      const bool may_capture = position.step > scaler->skipped_total();
      GraphedStep::Result graphed_step = graphed->run(x, y, scale, may_capture);
      graphed_check = std::move(graphed_step.check);
      update_ran = graphed_step.updated;
      samples += y.size(0);
      continue;
    }
    // The window's last backward all-reduces (the Reducer averages over the ranks); the
    // ones before only accumulate, as under DDP's no_sync().
    const bool sync = sync_every_micro_step || micro == window - 1;
    if (ddp) ddp->before_forward(/*window_start=*/micro == 0, sync);
    if (norm_window) norm_window->enter(micro);
    at::Tensor loss;
    {
      // Forward and loss under autocast, as torch.amp recommends; backward outside it.
      AutocastScope autocast(device.type(), plan.autocast_dtype, plan.autocast);
      at::Tensor logits = model->forward(x);
      loss = at::cross_entropy_loss(
          logits.scalar_type() == at::kFloat ? logits : logits.to(at::kFloat), y);
    }
    const double factor = scale / static_cast<double>(window);
    if (ddp) ddp->before_backward(sync, loss);
    (factor == 1.0 ? loss : loss * factor).backward();
    if (micro == 0) {
      loss_sum = loss.detach();
    } else {
      if (micro == 1) loss_sum = loss_sum * static_cast<double>(samples);
      loss_sum = loss_sum + loss.detach() * static_cast<double>(y.size(0));
    }
    samples += y.size(0);
  }
  if (norm_window) norm_window->finish();  // pooled running statistics, once per step
  position.batches_in_epoch += window;
  epoch_ended = position.batches_in_epoch >= batches_per_epoch;
  if (samples == 0) {
    // The loader ran dry before the epoch's count: nothing to step on, the epoch is over.
    epoch_ended = true;
    end_epoch();
    return;
  }
  const int64_t step = ++position.step;
  step_epoch = epoch;

  // Unscale, check, clip, scale update; then the optimizer, or a skip that touches nothing.
  const StepOutcome outcome =
      update_ran      ? optimizer_step->after_device_update(step, *graphed_check)
      : graphed_check ? optimizer_step->run_after_check(step, *graphed_check)
                      : optimizer_step->run(step, loss_sum, check_every_step || logged(step));
  const std::vector<double>& group_lrs = outcome.group_lrs;
  const std::string lr_note = lr_driver->change_note(outcome.lr);
  if (!lr_note.empty()) spdlog::info("step {}: {}", step, lr_note);
  if (outcome.verdict != StepVerdict::kApply) {
    const GradCheck& check = outcome.check;
    spdlog::warn("step {}: {}; step skipped{}", step,
                 check.measured ? fmt::format("non-finite gradients (loss scale {}) in {}", scale,
                                              join(check.non_finite))
                 : check.non_finite.empty()
                     ? std::string("non-finite loss")
                     : fmt::format("non-finite loss and gradients in {}", join(check.non_finite)),
                 plan.loss_scaling == KILN_SCALE_DYNAMIC
                     ? fmt::format(", loss scale now {}", scaler->scale())
                     : "");
  }

  double samples_total = static_cast<double>(samples);
  double loss_total = micro == 1 ? outcome.check.loss * samples_total : outcome.check.loss;
  int stop_signal = options.signals != nullptr ? options.signals->received() : 0;
  bool cancel = cancel_requested.load();
  if (group) {
    // One small all-reduce: the loss over every rank for the log, and a signal or a cancel any
    // rank received, so that all ranks stop after the same step.
    at::Tensor sums =
        at::tensor(std::vector<double>{loss_total, samples_total, stop_signal == SIGINT ? 1.0 : 0.0,
                                       stop_signal == SIGTERM ? 1.0 : 0.0, cancel ? 1.0 : 0.0});
    group->allreduce(sums, "sum");
    loss_total = sums[0].item<double>();
    samples_total = sums[1].item<double>();
    stop_signal = sums[3].item<double>() > 0   ? SIGTERM
                  : sums[2].item<double>() > 0 ? SIGINT
                                               : stop_signal;
    cancel = sums[4].item<double>() > 0;
  }
  const double loss_value = loss_total / samples_total;
  const double step_time = seconds_since(step_start) - data_time;
  io::StepRecord record{step,
                        epoch,
                        loss_value,
                        group_lrs,
                        step_time,
                        data_time,
                        samples_total / (step_time + data_time)};
  record.started = std::chrono::duration<double>(step_start - start).count();
  record.loss_scale = scale;
  record.grad_norm = outcome.check.norm;
  record.skipped = outcome.verdict != StepVerdict::kApply;
  record.skipped_total = scaler->skipped_total();
  record.micro_batches = micro;
  // The CPU's peak is the process's resident set, a system call to read (getrusage), and one
  // per step costs a dispatch-bound CPU step more than the call itself (docs/speed.md): it is
  // read on logged steps. CUDA's is the caching allocator's count, read every step.
  record.memory_mb = device.is_cpu() && !logged(step) ? std::nan("") : io::peak_memory_mib(device);
  const io::TensorMemory tensors = io::tensor_memory(device);
  // The CPU's tensors are counted only by Kiln's allocator (ProcessSettings::count_cpu_memory):
  // without it they are unknown (NaN, null in the metrics file), not zero.
  const bool counted = !device.is_cpu() || io::cpu_tensor_memory_counted();
  record.tensor_mb = counted ? mib(tensors.current_bytes) : NAN;
  record.tensor_peak_mb = counted ? mib(tensors.peak_bytes) : NAN;
  record.activation_mb = counted ? mib(tensors.peak_bytes - resting_bytes) : NAN;
  record.allreduces = ddp ? ddp->allreduce_calls() - allreduces_before : 0;
  metrics->write(record);
  // A stop asked for during the step (by the observer too) ends a one-process run after it;
  // ranks of a distributed run agree on one through the next step's all-reduce.
  if (options.on_step && options.on_step(record)) cancel_requested = true;
  if (!group && cancel_requested.load()) cancel = true;
  if (tensorboard) {
    tensorboard->scalar("train/loss", loss_value, step);
    for (size_t g = 0; g < groups.size(); ++g) {
      tensorboard->scalar("lr/" + groups[g].name, group_lrs[g], step);
    }
    tensorboard->scalar("train/loss_scale", scale, step);
    if (outcome.check.measured) tensorboard->scalar("train/grad_norm", outcome.check.norm, step);
    tensorboard->scalar("train/skipped_steps", static_cast<double>(scaler->skipped_total()), step);
    tensorboard->scalar("perf/samples_per_s", record.samples_per_s, step);
    tensorboard->scalar("perf/data_time", data_time, step);
    if (std::isfinite(record.memory_mb)) {
      tensorboard->scalar("perf/memory_mb", record.memory_mb, step);
    }
  }
  if (heartbeat) heartbeat->set_step(step);
  last = position;
  result.steps = step;
  result.skipped_steps = scaler->skipped_total();
  if (outcome.verdict == StepVerdict::kStop) {
    result.stopped = fmt::format("step {}: {}", step, scaler->stop_reason());
    if (writer) {
      result.saved_weights = save_weights(*model, written_run_dir(), step, result.stopped);
      spdlog::error("{}; weights saved to {}", result.stopped, result.saved_weights);
    }
    checkpoint(last);
    state = TrainerState::kStopped;
    return;
  }
  if (checkpoint_every > 0 && step % checkpoint_every == 0) checkpoint(last);
  if (stop_signal != 0 || cancel) {
    if (stop_signal != 0) {
      spdlog::warn("signal {}: stopping after step {}", stop_signal, step);
      result.signal = stop_signal;
    } else {
      spdlog::info("cancelled: stopping after step {}", step);
    }
    checkpoint(last);
    state = TrainerState::kCancelled;
    return;
  }
  window_loss += loss_total;
  window_samples += samples_total;
  io::ProgressState s;
  s.epoch = epoch;
  s.epochs = epochs;
  s.step = step;
  s.total_steps = max_steps;
  s.loss = window_loss / window_samples;
  s.lr = group_lrs[0];
  s.samples_per_s = window_samples / seconds_since(window_start);
  s.elapsed = seconds_since(start);
  s.first_step = first_step;
  // Logs get a line every log_interval steps. A terminal gets the bar redrawn ten times a
  // second at most, and at once after a log line cleared it: each redraw writes to the
  // terminal, a system call (docs/speed.md), and a small model's step is much shorter.
  if (logged(step)) {
    spdlog::info("{}", io::format_progress(s));
    window_loss = window_samples = 0.0;
    window_start = Clock::now();
  }
  // Not after the epoch's or the run's last step, whose end clears the bar at once.
  if (bar && !epoch_ended && step < max_steps) {
    const auto now = Clock::now();
    io::StatusLine& line = *options.status_line;
    if (!line.shown() || now - bar_drawn_at >= std::chrono::milliseconds(100)) {
      line.draw(io::format_progress_bar(s, io::terminal_width() - 1));
      bar_drawn_at = now;
    }
  }
  if (epoch_ended) end_epoch();
  if (step >= max_steps) finish();
}

// The epoch's batches are consumed: the next step opens the next epoch.
void Trainer::Impl::end_epoch() {
  clear_bar();
  epoch_open = false;
  last = {position.step, position.epoch + 1, 0};
  position = last;
  if (checkpoint_every == 0) checkpoint(last);
  if (position.epoch > epochs) finish();
}

// Every step is taken: the run's end is always checkpointed (a no-op when the last step already
// was).
void Trainer::Impl::finish() {
  if (state != TrainerState::kReady) return;
  state = TrainerState::kFinished;
  clear_bar();  // the run's last lines (here and the caller's) start on a clean line
  checkpoint(last);
  if (scaler->skipped_total() > 0) {
    spdlog::info("{} of {} steps skipped for non-finite gradients", scaler->skipped_total(),
                 position.step);
  }
}

io::EvalRecord Trainer::Impl::evaluate() {
  eval_due = false;
  const Evaluation e =
      evaluate_model(*model, *test_loader, device, plan, channels_last, group.get());
  // The epoch just trained: the open one, or the one before the next to open (0 before any).
  const int64_t epoch = epoch_open ? position.epoch : position.epoch - 1;
  const io::EvalRecord record{epoch, position.step, e.accuracy, e.loss};
  metrics->write(record);
  spdlog::info("epoch {} evaluation: test accuracy {:.2f}%  loss {:.4f}", record.epoch,
               100.0 * e.accuracy, e.loss);
  result.test_accuracy = e.accuracy;
  result.test_loss = e.loss;
  if (tensorboard) {
    tensorboard->scalar("eval/accuracy", e.accuracy, position.step);
    tensorboard->scalar("eval/loss", e.loss, position.step);
  }
  if (options.on_eval && options.on_eval(record)) cancel_requested = true;
  return record;
}

// ---- the public face ---------------------------------------------------------------------------

Trainer::Trainer(const config::Pipeline& pipeline, const RunOptions& options)
    : impl_(std::make_unique<Impl>(pipeline, options)) {}

Trainer::~Trainer() = default;

void Trainer::step() {
  impl_->blame([&] { impl_->step(); });
  if (impl_->options.on_progress) impl_->options.on_progress(progress());
}

io::EvalRecord Trainer::evaluate() {
  io::EvalRecord record = impl_->blame([&] { return impl_->evaluate(); });
  if (impl_->options.on_progress) impl_->options.on_progress(progress());
  return record;
}

std::string Trainer::save_checkpoint() {
  impl_->blame([&] { impl_->checkpoint(impl_->last, /*even_if_off=*/true); });
  return impl_->writer ? impl_->result.last_checkpoint : std::string();
}

// ---- the loop: steps, and an evaluation at each epoch's end -----------------------------------
RunResult Trainer::run() {
  Impl& t = *impl_;
  if (t.eval_due && t.p.run.get_bool("eval")) evaluate();
  while (t.state == TrainerState::kReady) {
    step();
    // At an epoch's end, and at the run's end mid-epoch; not after a stop or a cancel. A stop
    // an evaluation's observer asks for is honoured by the next step.
    const bool running = t.state == TrainerState::kReady || t.state == TrainerState::kFinished;
    if (running && (t.epoch_ended || t.state == TrainerState::kFinished) &&
        t.p.run.get_bool("eval")) {
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
  out.epochs = t.epochs;
  out.batches_in_epoch = t.epoch_ended ? t.batches_per_epoch : t.position.batches_in_epoch;
  out.batches_per_epoch = t.batches_per_epoch;
  out.epoch_ended = t.epoch_ended;
  out.rank = t.rank;
  out.world_size = t.world;
  return out;
}

const RunResult& Trainer::result() const { return impl_->result; }

RunResult train(const config::Pipeline& p, const RunOptions& options) {
  return Trainer(p, options).run();
}

}  // namespace kiln::engine
