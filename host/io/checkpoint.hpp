// Checkpoints on disk. A checkpoint is a folder <root>/step-<N>/ holding model.safetensors (the
// model's parameters and buffers, loadable by Python's safetensors and torch), trainer.safetensors
// (optimizer state, fp32 master weights, RNG states) and state.toml (position in the run, loss
// scale, a hash of the resolved config, plugin versions, and the size and CRC-32 of each file).
// It is written into a temporary folder, every file fsynced, then renamed into place, so a crash
// or kill at any moment leaves either the whole checkpoint or none.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint_state.hpp"  // CheckpointError, CheckpointInfo

namespace kiln::io {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct CheckpointData {
  CheckpointInfo info;
  NamedTensors model;    // parameters and buffers by name
  NamedTensors trainer;  // "optim/<param>/<state>", "master/<param>", "rng/cpu", "rng/cuda"
};

// Writes `data` as <root>/step-<N>, then removes the oldest checkpoints beyond `keep` (never one
// newer than this, nor step `protect`: the best). Returns the folder. Throws CheckpointError
// naming the path (the previous checkpoints are then untouched).
std::string write_checkpoint(const std::string& root, const CheckpointData& data, int64_t keep,
                             int64_t protect = -1);

// Removes the checkpoints at or below step `newest` beyond the newest `keep` of them, except step
// `protect`. Newer ones (another timeline) stay.
void prune_checkpoints(const std::string& root, int64_t newest, int64_t keep, int64_t protect);

// The best checkpoint by an evaluation metric (run.checkpoint_best): <root>/best.toml says which
// and why, and <root>/best is a link to its step-<N> folder, so every command that takes a
// checkpoint folder takes it.
struct BestCheckpoint {
  int64_t step = -1;
  std::string metric;  // accuracy, top5, loss
  double value = 0.0;
  std::vector<int64_t> since;  // steps of the evaluations after it that did not beat it
};

// Replaces best.toml and the link, each by a rename (a crash leaves the old or the new one).
// Throws CheckpointError naming the path.
void write_best(const std::string& root, const BestCheckpoint& best);
// best.toml under `root`; nullopt when there is none or it cannot be read (then the run judges
// afresh).
std::optional<BestCheckpoint> read_best(const std::string& root);

// A checkpoint's folder name under its root: "step-<N>", N zero-padded to 9 digits.
std::string checkpoint_name(int64_t step);

// Reads `dir` and verifies every file against state.toml (size and CRC-32), checking state.toml
// (io/checkpoint_state.hpp) and both safetensors files (io/safetensors_layout.hpp) as files from
// elsewhere. Throws CheckpointError naming `dir` (and the file, field or tensor) and what is wrong.
CheckpointData read_checkpoint(const std::string& dir);

// The checkpoint folders under `root`, newest (highest step) first; none when root is absent.
// Entries whose name is not step-<N> (N a 64-bit count) are not checkpoints and are skipped.
std::vector<std::string> list_checkpoints(const std::string& root);

// What a run's start found under its checkpoint root besides checkpoints.
struct CheckpointRootScan {
  std::vector<std::string> removed_partial;  // .tmp-step-* folders a killed write left: removed
  std::vector<std::string> ignored;  // entries that are not step-<N> folders (nor the best's)
};

// Removes the partial checkpoints (.tmp-step-*) that writes interrupted by a kill or a crash
// left under `root`, and names the entries list_checkpoints skips, so the run can warn about
// them. Call before the run writes its first checkpoint (a write in progress is also .tmp-).
CheckpointRootScan clean_checkpoint_root(const std::string& root);

}  // namespace kiln::io
