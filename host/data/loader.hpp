// Batches from a Dataset: seeded shuffling per epoch, per-rank shards, worker threads that
// assemble (and augment) batches ahead of the training loop, delivered in a fixed order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "data/dataset.hpp"

namespace kiln::data {

struct LoaderOptions {
  int64_t batch_size = 128;  // per rank
  bool shuffle = true;       // reshuffle every epoch from (seed, epoch)
  bool drop_last = false;    // drop a last incomplete batch
  uint64_t seed = 0;
  int workers = 2;           // threads assembling batches (0: assemble on the caller's thread)
  int prefetch = 4;          // batches ready ahead of the consumer
  int64_t crop_padding = 0;  // >0: random crop after zero padding by this many pixels
  bool flip = false;         // random horizontal flip
  double mean = 0.0;         // normalisation: (x/255 - mean) / std
  double std = 1.0;
  int rank = 0;             // this rank's shard of world_size disjoint shards; shards are
  int world_size = 1;       // padded (wrapping around) to equal length
  bool pad_shards = true;   // false: unequal shards, every sample seen once (evaluation)
  bool pin_memory = false;  // allocate batches in pinned memory (for CUDA copies)
};

struct Batch {
  at::Tensor images;  // float32 N×C×H×W
  at::Tensor labels;  // int64 N
  int64_t index = 0;  // batch index within the epoch
};

class Loader {
 public:
  Loader(const Dataset& dataset, LoaderOptions options);  // dataset must outlive the loader
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t batches_per_epoch() const;
  int64_t samples_per_epoch() const;  // this rank's samples per epoch (after padding)
  // Starts epoch `epoch` (0-based): fixes the order and starts the workers. Any unconsumed
  // batches of the previous epoch are discarded.
  // `first_batch` > 0 continues an epoch part-way (a resumed run): the batches before it are
  // skipped without being built, and the ones after are the same as in an uninterrupted epoch.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The next batch of the current epoch in order, or nullopt at its end. Blocks until ready.
  std::optional<Batch> next();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::data
