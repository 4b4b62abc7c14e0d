// The training loop, top to bottom: build the components, then for each epoch and batch run
// forward, loss, backward and the optimizer step, log, and evaluate at the end of the epoch.
#include "engine/trainer.hpp"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "data/dataset.hpp"
#include "data/loader.hpp"
#include "engine/checks.hpp"
#include "engine/lr_driver.hpp"
#include "engine/param_groups.hpp"
#include "io/metrics.hpp"
#include "io/progress.hpp"
#include "kiln/torch.hpp"
#include "plugin/adapters.hpp"
#include "plugin/host_api.hpp"
#include "plugin/norm_layer.hpp"

namespace kiln::engine {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Train and test splits. Synthetic splits come from one draw (same class prototypes, disjoint
// samples), so the test split measures what the model learnt.
std::pair<data::Dataset, data::Dataset> load_data(const config::OptionSet& d, uint64_t seed) {
  if (d.get_string("dataset") == "synthetic") {
    data::SyntheticSpec spec;
    const int64_t n_train = d.get_int("synthetic_train");
    spec.samples = n_train + d.get_int("synthetic_test");
    spec.num_classes = d.get_int("synthetic_classes");
    spec.channels = d.get_int("channels");
    spec.height = d.get_int("height");
    spec.width = d.get_int("width");
    spec.seed = seed;
    data::Dataset all = data::make_synthetic(spec);
    auto slice = [&](int64_t from, int64_t to) {
      data::Dataset part;
      part.images = all.images.slice(0, from, to).contiguous();
      part.labels = all.labels.slice(0, from, to).contiguous();
      part.num_classes = all.num_classes;
      return part;
    };
    return {slice(0, n_train), slice(n_train, spec.samples)};
  }
  const std::string root = d.get_string("root");
  return {data::load_fashion_mnist(root, "train"), data::load_fashion_mnist(root, "test")};
}

data::LoaderOptions loader_options(const config::OptionSet& d, uint64_t seed, bool train,
                                   at::Device device) {
  data::LoaderOptions o;
  o.batch_size = train ? d.get_int("batch_size") : d.get_int("eval_batch_size");
  o.shuffle = train && d.get_bool("shuffle");
  o.drop_last = train && d.get_bool("drop_last");
  o.seed = seed;
  o.workers = static_cast<int>(d.get_int("workers"));
  o.prefetch = static_cast<int>(d.get_int("prefetch"));
  o.crop_padding = train ? d.get_int("random_crop") : 0;
  o.flip = train && d.get_bool("random_flip");
  o.mean = d.get_float("mean");
  o.std = d.get_float("std");
  o.pin_memory = device.is_cuda();
  return o;
}

struct Evaluation {
  double accuracy = 0.0, loss = 0.0;
};

Evaluation evaluate(kiln::Model& model, data::Loader& loader, at::Device device) {
  at::NoGradGuard no_grad;
  model.eval();
  loader.start_epoch(0);
  double loss_sum = 0.0;
  int64_t correct = 0, seen = 0;
  while (auto batch = loader.next()) {
    at::Tensor x = batch->images.to(device, /*non_blocking=*/true);
    at::Tensor y = batch->labels.to(device, /*non_blocking=*/true);
    at::Tensor logits = model.forward(x);
    loss_sum += at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    correct += logits.argmax(1).eq(y).sum().item<int64_t>();
    seen += y.size(0);
  }
  model.train();
  return {seen ? static_cast<double>(correct) / seen : NAN, seen ? loss_sum / seen : NAN};
}

}  // namespace

RunResult train(const config::Pipeline& p, const RunOptions& options) {
  // ---- set-up ----------------------------------------------------------------------------------
  const auto& run = p.run;
  if (run.get_int("threads") > 0) at::set_num_threads(static_cast<int>(run.get_int("threads")));
  const auto seed = static_cast<uint64_t>(run.get_int("seed"));
  at::manual_seed(seed);
  const at::Device device = resolve_device(run.get_string("device"));
  check_pipeline(p, device);

  // ---- data ------------------------------------------------------------------------------------
  auto [train_set, test_set] = load_data(p.data, seed);
  data::Loader train_loader(train_set, loader_options(p.data, seed, true, device));
  data::Loader test_loader(test_set, loader_options(p.data, seed, false, device));

  // ---- model, with the pipeline's norm plugin behind every norm layer --------------------------
  plugin::set_norm_factory([&](const kiln_norm_request& request) {
    return std::make_shared<plugin::PluginNormLayer>(*p.norm.component, p.norm.options, request);
  });
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  input.channels = train_set.images.size(1);
  input.height = train_set.images.size(2);
  input.width = train_set.images.size(3);
  input.num_classes = train_set.num_classes;
  std::shared_ptr<kiln::Model> model =
      plugin::create_model(*p.model.component, p.model.options, input);
  plugin::set_norm_factory(nullptr);
  model->to(device);
  model->train();

  // ---- optimizer and schedule ------------------------------------------------------------------
  std::vector<ParamGroup> groups = build_param_groups(*model, group_rules(p));
  plugin::OptimizerAdapter optimizer(*p.optimizer.component, p.optimizer.options);
  const int64_t epochs = run.get_int("epochs");
  const ScheduleFrame frame = schedule_frame(p, train_loader.batches_per_epoch());
  const int64_t max_steps = frame.max_iters;
  plugin::LrPolicyAdapter lr_policy(*p.lr_policy.component, p.lr_policy.options,
                                    to_policy_schedule(frame));
  LrDriver lr_driver(frame, lr_policy);

  io::MetricsWriter metrics(options.metrics_path);
  const int64_t log_interval = run.get_int("log_interval");
  size_t trainable = 0;
  for (const auto& g : groups) trainable += g.params.size();
  spdlog::info("training {} ({} parameter tensors in {} group(s)) on {} for {} steps of {} samples",
               std::string(p.model.component->name()), trainable, groups.size(), device.str(),
               max_steps, frame.effective_batch);
  if (frame.base_lr != frame.unscaled_lr) {
    spdlog::info("lr scaled linearly: {} x {} / {} = {}", frame.unscaled_lr,
                 frame.effective_batch, p.lr_scaling.get_int("base_batch"), frame.base_lr);
  }

  // ---- the loop --------------------------------------------------------------------------------
  RunResult result;
  result.test_accuracy = NAN;
  const auto start = Clock::now();
  int64_t step = 0;
  double window_loss = 0.0, window_samples = 0.0;
  auto window_start = Clock::now();
  std::vector<double> group_lrs(groups.size());
  for (int64_t epoch = 1; epoch <= epochs && step < max_steps; ++epoch) {
    train_loader.start_epoch(epoch - 1);
    auto data_start = Clock::now();
    while (step < max_steps) {
      std::optional<data::Batch> batch = train_loader.next();
      if (!batch) break;
      const double data_time = seconds_since(data_start);
      const auto step_start = Clock::now();
      ++step;

      at::Tensor x = batch->images.to(device, /*non_blocking=*/true);
      at::Tensor y = batch->labels.to(device, /*non_blocking=*/true);
      for (auto& group : groups) {
        for (auto& param : group.params) param.mutable_grad() = at::Tensor();
      }
      at::Tensor loss = at::cross_entropy_loss(model->forward(x), y);
      loss.backward();

      const double lr = lr_driver.current();
      if (lr_driver.changed_notably(lr)) spdlog::info("step {}: lr {:.6g}", step, lr);
      for (size_t g = 0; g < groups.size(); ++g) {
        group_lrs[g] = lr * groups[g].lr_scale;
        plugin::GroupStep view;
        view.params = &groups[g].params;
        view.names = &groups[g].names;
        view.group_index = g;
        view.step = step;
        view.lr = group_lrs[g];
        view.weight_decay = groups[g].weight_decay;
        optimizer.step(view);
      }
      lr_driver.advance(/*applied=*/true);

      const double loss_value = loss.item<double>();
      const double step_time = seconds_since(step_start);
      const auto samples = static_cast<double>(y.size(0));
      metrics.write(io::StepRecord{step, epoch, loss_value, group_lrs, step_time, data_time,
                                   samples / (step_time + data_time)});
      window_loss += loss_value * samples;
      window_samples += samples;
      if (step % log_interval == 0 || step == max_steps) {
        io::ProgressState s;
        s.epoch = epoch;
        s.epochs = epochs;
        s.step = step;
        s.total_steps = max_steps;
        s.loss = window_loss / window_samples;
        s.lr = group_lrs[0];
        s.samples_per_s = window_samples / seconds_since(window_start);
        s.elapsed = seconds_since(start);
        spdlog::info("{}", io::format_progress(s));
        window_loss = window_samples = 0.0;
        window_start = Clock::now();
      }
      data_start = Clock::now();
    }
    if (run.get_bool("eval")) {
      Evaluation e = evaluate(*model, test_loader, device);
      metrics.write(io::EvalRecord{epoch, step, e.accuracy, e.loss});
      spdlog::info("epoch {} evaluation: test accuracy {:.2f}%  loss {:.4f}", epoch,
                   100.0 * e.accuracy, e.loss);
      result.test_accuracy = e.accuracy;
      result.test_loss = e.loss;
    }
  }
  result.steps = step;
  result.train_seconds = seconds_since(start);
  return result;
}

}  // namespace kiln::engine
