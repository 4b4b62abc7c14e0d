// Checkpoints on disk. A checkpoint is a folder <root>/step-<N>/ holding model.safetensors (the
// model's parameters and buffers, loadable by Python's safetensors and torch), trainer.safetensors
// (optimizer state, fp32 master weights, RNG states) and state.toml (position in the run, loss
// scale, a hash of the resolved config, plugin versions, and the size and CRC-32 of each file).
// It is written into a temporary folder, every file fsynced, then renamed into place, so a crash
// or kill at any moment leaves either the whole checkpoint or none.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
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
// newer than this). Returns the folder. Throws CheckpointError naming the path (the previous
// checkpoints are then untouched).
std::string write_checkpoint(const std::string& root, const CheckpointData& data, int64_t keep);

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
  std::vector<std::string> ignored;          // entries that are not step-<N> folders: left alone
};

// Removes the partial checkpoints (.tmp-step-*) that writes interrupted by a kill or a crash
// left under `root`, and names the entries list_checkpoints skips, so the run can warn about
// them. Call before the run writes its first checkpoint (a write in progress is also .tmp-).
CheckpointRootScan clean_checkpoint_root(const std::string& root);

}  // namespace kiln::io
