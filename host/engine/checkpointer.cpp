#include "engine/checkpointer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/filesystem.hpp>

#include "engine/resume.hpp"
#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"

namespace kiln::engine {

std::string output_dir(const config::Pipeline& p) {
  if (!p.settings.run.output_dir.empty()) return p.settings.run.output_dir;
  std::string stem = boost::filesystem::path(p.path).stem().string();
  return "runs/" + (stem.empty() ? std::string("kiln") : stem);
}

void tidy_run_folder(const io::RunFolder& folder) {
  if (folder.is_new) return;
  spdlog::info("run folder {} ({})", folder.path, folder.why);
  const io::CheckpointRootScan scan = io::clean_checkpoint_root(folder.path + "/checkpoints");
  for (const std::string& partial : scan.removed_partial) {
    spdlog::info("removed {}: a checkpoint whose write was interrupted", partial);
  }
  for (const std::string& stray : scan.ignored) {
    spdlog::warn("{}: not a checkpoint (checkpoints are step-<N> folders); ignored", stray);
  }
}

Checkpointer::Checkpointer(const config::Pipeline& pipeline, io::RunFolder folder, bool writer,
                           torch::nn::Module& model, const OptimizerSide& optimizer,
                           const ModelEma* ema)
    : p_(pipeline),
      folder_(std::move(folder)),
      writer_(writer),
      model_(model),
      optimizer_(optimizer),
      ema_(ema) {}

void Checkpointer::save(const RunPosition& at, bool even_if_off) {
  if (!writer_ || (!even_if_off && !p_.settings.run.checkpoints) || at.step == saved_step_) return;
  if (flush_) flush_();
  last_ =
      io::write_checkpoint(run_dir() + "/checkpoints", capture(at, model_, optimizer_, p_, ema_),
                           p_.settings.run.checkpoint_keep, best_step_);
  saved_step_ = at.step;
  spdlog::info("checkpoint {}", last_);
}

void Checkpointer::keep_best(const RunPosition& at, const io::BestCheckpoint& best) {
  if (!writer_) return;
  save(at);
  const std::string root = run_dir() + "/checkpoints";
  io::write_best(root, best);
  const int64_t previous = best_step_;
  best_step_ = at.step;
  // The previous best, no longer kept, goes as checkpoint_keep would have taken it.
  if (previous >= 0 && previous != at.step) {
    io::prune_checkpoints(root, saved_step_, p_.settings.run.checkpoint_keep, best_step_);
  }
  spdlog::info("best {} so far: {:.6g} at step {} (checkpoints/best)", best.metric, best.value,
               at.step);
}

void Checkpointer::note_best(const io::BestCheckpoint& best) {
  if (writer_) io::write_best(run_dir() + "/checkpoints", best);
}

std::optional<io::BestCheckpoint> Checkpointer::restore_best(const std::string& metric,
                                                             int64_t resumed_step) {
  if (folder_.is_new) return std::nullopt;
  const std::string root = folder_.path + "/checkpoints";
  std::optional<io::BestCheckpoint> best = io::read_best(root);
  if (!best || best->metric != metric || best->step > resumed_step) return std::nullopt;
  boost::system::error_code ec;
  if (!boost::filesystem::is_directory(root + "/" + io::checkpoint_name(best->step), ec)) {
    return std::nullopt;
  }
  best_step_ = best->step;
  best->since.erase(std::remove_if(best->since.begin(), best->since.end(),
                                   [&](int64_t step) { return step > resumed_step; }),
                    best->since.end());
  return best;
}

std::string Checkpointer::save_weights(int64_t step, const std::string& reason) {
  const std::string dir = run_dir();
  boost::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : model_.named_parameters()) tensors.emplace_back(item.key(), item.value());
  for (const auto& item : model_.named_buffers()) tensors.emplace_back(item.key(), item.value());
  const std::string path = dir + "/weights-step-" + std::to_string(step) + ".safetensors";
  io::write_safetensors(path, tensors, {{"step", std::to_string(step)}, {"stopped", reason}});
  return path;
}

const std::string& Checkpointer::run_dir() {
  if (folder_.is_new) {
    folder_.path = io::create_run_folder(output_dir(p_));
    folder_.is_new = false;
    spdlog::info("run folder {} ({})", folder_.path, folder_.why);
  }
  return folder_.path;
}

}  // namespace kiln::engine
