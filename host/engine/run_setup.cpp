#include "engine/run_setup.hpp"

#include <ATen/ops/zeros.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <array>
#include <chrono>

#include "engine/activation_checkpoint.hpp"
#include "engine/checks.hpp"
#include "engine/conv_layouts.hpp"
#include "engine/memory_format.hpp"
#include "engine/model_build.hpp"
#include "engine/resume.hpp"
#include "engine/run_data.hpp"

namespace kiln::engine {

Ranks join_ranks(const config::DistSettings& d, const dist::LaunchEnv* launch, at::Device& device) {
  Ranks r;
  if (launch == nullptr) return r;
  const dist::LaunchEnv& env = *launch;
  if (device.is_cuda()) {
    // One GPU per local rank, among those CUDA_VISIBLE_DEVICES leaves visible.
    device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
    c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(device);
  }
  dist::GroupOptions g;
  g.backend = d.backend != "auto" ? d.backend : device.is_cuda() ? "nccl" : "gloo";
  g.master_addr = env.master_addr;
  g.port = env.master_port;
  g.rank = env.rank;
  g.world_size = env.world_size;
  g.device_index = env.local_rank;
  g.agent_store = env.agent_store;
  g.run_id = env.run_id;
  g.restart_count = env.restart_count;
  g.timeout = std::chrono::milliseconds(static_cast<int64_t>(1000.0 * d.timeout_s));
  r.group = std::make_unique<dist::ProcessGroup>(g);
  r.heartbeat = std::make_unique<dist::Heartbeat>(r.group->store(), env.rank, env.world_size);
  r.rank = env.rank;
  r.world = env.world_size;
  spdlog::info("rank {} of {} joined the {} group at {}:{} ({})", r.rank, r.world, g.backend,
               env.master_addr, env.master_port, env.source);
  return r;
}

std::unique_ptr<RunData> load_run_data(const config::Pipeline& p, at::Device device,
                                       const Ranks& ranks) {
  const config::DataSettings& d = p.settings.data;
  const uint64_t seed = p.settings.run.seed;
  auto r = std::make_unique<RunData>();
  DataSplits splits = load_data(p);
  r->train_set = splits.train;
  r->test_set = splits.test;
  r->train.emplace(*r->train_set, loader_options(d, seed, true, device, ranks.rank, ranks.world));
  r->summary = describe_data(p, splits, r->train->sample_shape());
  if (r->test_set) {
    r->test.emplace(*r->test_set, loader_options(d, seed, false, device, ranks.rank, ranks.world));
  }
  r->batches_per_epoch = r->train->batches_per_epoch();
  return r;
}

namespace {

// model.memory_format = "auto" on the CPU in float32: the convolutions on small maps with many
// channels stay NCHW, where oneDNN's blocked kernels are faster (engine/conv_layouts.hpp).
void keep_small_maps_in_nchw(kiln::Model& model, const std::array<int64_t, 3>& sample_shape,
                             dist::ProcessGroup* group) {
  at::Tensor weight;
  for (const at::Tensor& t : model.parameters()) {
    if (t.dim() == 4) {
      weight = t;
      break;
    }
  }
  // Measured in float32 only; every rank reaches the same answer here (same model and plan).
  if (!weight.defined() || weight.scalar_type() != at::kFloat) return;
  std::vector<int64_t> sizes{2};
  sizes.insert(sizes.end(), sample_shape.begin(), sample_shape.end());
  const at::Tensor sample = in_model_layout(at::zeros(sizes, weight.options()), true);
  const NchwChoice c = keep_small_maps_nchw(model, sample, onednn_uses_avx512(), group);
  if (!c.trace_error.empty()) {
    spdlog::warn("memory format: tracing the model's convolutions failed ({}); all stay NHWC",
                 c.trace_error);
  }
  if (!c.names.empty()) {
    spdlog::info(
        "memory format: {} convolutions on small maps stay NCHW, where oneDNN's blocked kernels "
        "are faster: {}",
        c.names.size(), fmt::join(c.names, ", "));
  }
}

}  // namespace

ModelSide build_model_side(const config::Pipeline& p, const RunData& data, const Ranks& ranks,
                           at::Device device, const PrecisionPlan& plan) {
  ModelSide m;
  // The model, with the pipeline's norm plugin behind every norm layer.
  m.norm_window = norm_window_for(p);
  const auto shape = data.train->sample_shape();
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  input.channels = shape[0];
  input.height = shape[1];
  input.width = shape[2];
  input.num_classes = data.train_set->num_classes();
  // Synced norm layers and the optimizer reach the run's group through their calls' contexts.
  m.model = build_model(p, input, device.type(), ranks.world, m.norm_window, ranks.group.get());
  load_initial_weights(p, *m.model);
  const std::string checkpointing = apply_activation_checkpointing(
      *m.model, p.settings.memory.checkpoint, std::string(p.model.component->name()));
  m.checkpointing = !checkpointing.empty();
  if (m.checkpointing) spdlog::info("activation checkpointing: {}", checkpointing);
  m.model->to(device);
  cast_model(*m.model, plan);
  check_model_precision(*m.model, plan);
  m.channels_last = use_channels_last(p.settings.model.memory_format, device, plan, *m.model);
  if (m.channels_last) {
    spdlog::info("memory format channels_last: {} 4-D tensors restrided, batches follow",
                 to_channels_last(*m.model));
    if (device.is_cpu() && !plan.autocast && p.settings.model.memory_format == "auto") {
      keep_small_maps_in_nchw(*m.model, shape, ranks.group.get());
    }
  }
  m.model->train();
  return m;
}

std::unique_ptr<dist::DataParallel> data_parallel(const config::DistSettings& d, const Ranks& ranks,
                                                  kiln::Model& model) {
  if (!ranks.group) return nullptr;
  std::vector<at::Tensor> params, buffers;
  for (const auto& t : model.parameters()) {
    if (t.requires_grad()) params.push_back(t);
  }
  for (const auto& t : model.buffers()) buffers.push_back(t);
  dist::DataParallelOptions o;
  o.bucket_cap_mb = d.bucket_cap_mb;
  o.find_unused_parameters = d.find_unused_parameters;
  o.broadcast_buffers = d.broadcast_buffers;
  o.compression = d.gradient_compression;
  o.gradient_as_bucket_view = d.gradient_as_bucket_view;
  auto ddp = std::make_unique<dist::DataParallel>(*ranks.group, params, buffers, o);
  spdlog::info("data parallel over {} ranks: gradient buckets of up to {} MiB{}", ranks.world,
               o.bucket_cap_mb,
               o.compression == "none" ? "" : ", " + o.compression + " on the wire");
  return ddp;
}

std::unique_ptr<GraphedStep> step_graph(const config::Pipeline& p, const Ranks& ranks,
                                        at::Device device, const PrecisionPlan& plan,
                                        const ModelSide& model, const Loss& loss,
                                        OptimizerSide& optimizer,
                                        std::function<int64_t()> next_step) {
  if (!p.settings.run.cuda_graph) return nullptr;
  GraphConditions conditions;
  conditions.cuda = device.is_cuda();
  conditions.world_size = ranks.world;
  conditions.accumulation = p.settings.run.accumulation_steps;
  conditions.master_weights = plan.master_weights;
  conditions.activation_checkpointing = model.checkpointing;
  if (const std::string why_not = graph_unsupported_reason(conditions); !why_not.empty()) {
    spdlog::warn("run.cuda_graph: {}; the step runs eagerly", why_not);
    return nullptr;
  }
  if (optimizer.updates().reevaluates()) {
    spdlog::warn(
        "run.cuda_graph: optimizer '{}' takes the whole step and may evaluate the model again "
        "inside it, which one captured graph cannot replay; the step runs eagerly",
        optimizer.optimizer().name());
    return nullptr;
  }
  std::vector<at::Tensor> trainable;
  for (const auto& g : optimizer.groups())
    trainable.insert(trainable.end(), g.params.begin(), g.params.end());
  auto graph = std::make_unique<GraphedStep>(*model.model, loss, std::move(trainable), plan,
                                             optimizer.clip().norm_type, device);
  OptimizerStep& updates = optimizer.updates();
  if (updates.capturable()) {
    graph->set_update([&updates, next_step](const at::Tensor& readout) {
      updates.enqueue_update(next_step(), readout);
    });
    spdlog::info(
        "run.cuda_graph: forward, backward, the check, clipping and the optimizer are captured "
        "after {} eager steps",
        GraphedStep::kWarmupSteps);
  } else {
    spdlog::info(
        "run.cuda_graph: forward, backward and the check are captured after {} eager steps; "
        "optimizer '{}' is not capturable (KILN_CAP_CAPTURABLE), so it runs after each replay",
        GraphedStep::kWarmupSteps, optimizer.optimizer().name());
  }
  return graph;
}

void log_run_summary(const config::Pipeline& p, at::Device device, const PrecisionPlan& plan,
                     const OptimizerSide& optimizer, const ScheduleFrame& frame) {
  size_t trainable = 0;
  for (const auto& g : optimizer.groups()) trainable += g.params.size();
  spdlog::info("training {} ({} parameter tensors in {} group(s)) on {} for {} steps of {} samples",
               std::string(p.model.component->name()), trainable, optimizer.groups().size(),
               device.str(), frame.max_iters, frame.effective_batch);
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
                 p.settings.lr_scaling.base_batch, frame.base_lr);
  }
}

}  // namespace kiln::engine
