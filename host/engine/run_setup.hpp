// The parts a run is built from, each by one function, in the order Trainer builds them: the
// ranks (a process group for a distributed run), the data, the model, data parallelism and the
// CUDA graph of the step. The optimizer side is engine/optimizer_side.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <optional>
#include <string>

#include "config/pipeline.hpp"
#include "data/dataset.hpp"
#include "data/loader.hpp"
#include "dist/data_parallel.hpp"
#include "dist/heartbeat.hpp"
#include "dist/launch_env.hpp"
#include "dist/process_group.hpp"
#include "engine/graph_step.hpp"
#include "engine/optimizer_side.hpp"
#include "engine/precision.hpp"
#include "kiln/torch.hpp"
#include "plugin/norm_window.hpp"

namespace kiln::engine {

// This process's place in the run: one process, or a rank of a process group.
struct Ranks {
  std::unique_ptr<dist::ProcessGroup> group;  // null in a single-process run
  std::unique_ptr<dist::Heartbeat> heartbeat;
  int rank = 0, world = 1;
};
// Joins the process group of a distributed run (`launch`; null: one process, nothing joined).
// On CUDA, `device` becomes the local rank's GPU.
Ranks join_ranks(const config::DistSettings& dist, const dist::LaunchEnv* launch,
                 at::Device& device);

// Built in place: the loaders read the splits beside them.
struct RunData {
  std::shared_ptr<const data::Source> train_set, test_set;
  std::optional<data::Loader> train, test;  // this rank's loaders
  int64_t batches_per_epoch = 0;            // of `train`
  std::string summary;                      // what the splits hold (describe_data), for the log
};
std::unique_ptr<RunData> load_run_data(const config::Pipeline& pipeline, at::Device device,
                                       const Ranks& ranks);

struct ModelSide {
  std::shared_ptr<kiln::Model> model;
  // Where the norm layers are in a step's micro-batches, when norm.running_stats_update has the
  // host move their running statistics (accumulation only); null otherwise.
  std::shared_ptr<plugin::NormWindow> norm_window;
  bool channels_last = false;  // 4-D weights and batches in NHWC (model.memory_format)
  bool checkpointing = false;  // activation checkpointing applied
};
// The model for the training batches' inputs with its starting weights (model.init), activation
// checkpointing, on `device` in the plan's dtypes and layout, in training mode.
ModelSide build_model_side(const config::Pipeline& pipeline, const RunData& data,
                           const Ranks& ranks, at::Device device, const PrecisionPlan& plan);

// Gradient all-reduce over the ranks (null in a single-process run).
std::unique_ptr<dist::DataParallel> data_parallel(const config::DistSettings& dist,
                                                  const Ranks& ranks, kiln::Model& model);

// run.cuda_graph's graph of the step, where the run allows one (else null, and the log says
// why); with a capturable optimizer the graph enqueues its update, numbered from `next_step`.
std::unique_ptr<GraphedStep> step_graph(const config::Pipeline& pipeline, const Ranks& ranks,
                                        at::Device device, const PrecisionPlan& plan,
                                        const ModelSide& model, const Loss& loss,
                                        OptimizerSide& optimizer,
                                        std::function<int64_t()> next_step);

// The run's opening lines: what trains, where, how long, in which precision.
void log_run_summary(const config::Pipeline& pipeline, at::Device device, const PrecisionPlan& plan,
                     const OptimizerSide& optimizer, const ScheduleFrame& frame);

}  // namespace kiln::engine
