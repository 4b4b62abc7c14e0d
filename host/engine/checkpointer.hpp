// What a run writes to disk besides metrics: its run folder (io/run_folder), created by the
// first write so that a run that writes nothing leaves no empty folder; checkpoints of the
// model and the optimizer side; and the weights a guard saves when it stops the run. Rank 0
// alone writes: the ranks hold the same state.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "config/pipeline.hpp"
#include "engine/model_ema.hpp"
#include "engine/optimizer_side.hpp"
#include "engine/run_position.hpp"
#include "io/checkpoint.hpp"
#include "io/run_folder.hpp"

namespace kiln::engine {

// run.output_dir, or runs/<pipeline file name>: the folder of a pipeline's run folders.
std::string output_dir(const config::Pipeline& pipeline);

// A run folder a resumed run continues: logs it, removes the checkpoints whose write was
// interrupted and names what is not a checkpoint. Nothing for a new one.
void tidy_run_folder(const io::RunFolder& folder);

class Checkpointer {
 public:
  // `model`, `optimizer` and `ema` (the weights' average; null: none) must outlive this object.
  // `writer`: this rank writes.
  Checkpointer(const config::Pipeline& pipeline, io::RunFolder folder, bool writer,
               torch::nn::Module& model, const OptimizerSide& optimizer,
               const ModelEma* ema = nullptr);

  // Called before a checkpoint is written, so that every step it covers has its metrics line
  // and TensorBoard events on disk (a resumed run starts after them).
  void set_flush(std::function<void()> flush) { flush_ = std::move(flush); }
  // A checkpoint of the state at `at`, unless run.checkpoints is off (and not `even_if_off`),
  // this rank does not write, or that step's is already written (or was resumed from).
  void save(const RunPosition& at, bool even_if_off = false);
  void saved_at(int64_t step) { saved_step_ = step; }
  // Keeps the checkpoint at `at` (written now unless it is) as the best (`best.step` is
  // at.step): checkpoints/best.toml and the link checkpoints/best, and out of checkpoint_keep's
  // pruning.
  void keep_best(const RunPosition& at, const io::BestCheckpoint& best);
  // Rewrites the best's record (the evaluations since it that did not beat it).
  void note_best(const io::BestCheckpoint& best);
  // A resumed run's best so far: the record in its run folder, when it is of `metric` and of a
  // step at or before `resumed_step` whose checkpoint is there (a later one belongs to the
  // timeline the resume replaces), with the evaluations since it up to `resumed_step`. Its
  // checkpoint is then kept as the best.
  std::optional<io::BestCheckpoint> restore_best(const std::string& metric, int64_t resumed_step);
  // The model's tensors as weights-step-<step>.safetensors in the run folder; its path.
  std::string save_weights(int64_t step, const std::string& reason);
  // The run folder, created now when it is a new one: the next free number then, so that two
  // runs starting together in one output folder never share one.
  const std::string& run_dir();

  bool writer() const { return writer_; }
  const std::string& last() const { return last_; }  // newest checkpoint written; "" none

 private:
  const config::Pipeline& p_;
  io::RunFolder folder_;
  bool writer_;
  torch::nn::Module& model_;
  const OptimizerSide& optimizer_;
  const ModelEma* ema_;
  std::function<void()> flush_;
  int64_t saved_step_ = -1;
  int64_t best_step_ = -1;  // kept out of the pruning
  std::string last_;
};

}  // namespace kiln::engine
