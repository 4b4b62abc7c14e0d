// Batches from a Source: seeded shuffling per epoch, per-rank shards, worker threads that
// decode, transform (torchvision's transforms, data/transforms.hpp) and mix (data/mix.hpp)
// batches ahead of the training loop, delivered in a fixed order.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "data/dataset.hpp"
#include "data/mix.hpp"
#include "data/source.hpp"

namespace kiln::data {

struct LoaderOptions {
  int64_t batch_size = 128;  // per rank
  bool shuffle = true;       // reshuffle every epoch from (seed, epoch)
  bool drop_last = false;    // drop a last incomplete batch
  uint64_t seed = 0;
  int workers = 2;   // threads assembling batches (0: assemble on the caller's thread)
  int prefetch = 4;  // batches ready ahead of the consumer
  // The transforms, in torchvision's order: RandomResizedCrop(rrc_size) when > 0, else
  // Resize(resize) of the shorter side and CenterCrop(center_crop) where > 0; then zero padding
  // + RandomCrop (crop_padding), RandomHorizontalFlip, ToTensor + Normalize, then mixing.
  int64_t rrc_size = 0;
  std::array<double, 2> rrc_scale{0.08, 1.0};
  std::array<double, 2> rrc_ratio{3.0 / 4.0, 4.0 / 3.0};
  int64_t resize = 0;
  int64_t center_crop = 0;
  // Ask the source for a reduced decode (1/2, 1/4, 1/8) where the crop keeps at least the
  // output's pixels; false: always full scale (torchvision's pixels exactly).
  bool decode_scaled = true;
  int64_t crop_padding = 0;  // >0: random crop after zero padding by this many pixels
  bool flip = false;         // random horizontal flip
  // Normalisation (x/255 - mean) / std: one value for every channel, or one per channel.
  std::vector<double> mean{0.0};
  std::vector<double> std{1.0};
  MixOptions mix;                 // mixup / cutmix: batches then carry soft targets
  bool skip_bad_samples = false;  // a SampleError: replace the sample (else the batch fails)
  int rank = 0;                   // this rank's shard of world_size disjoint shards; shards are
  int world_size = 1;             // padded (wrapping around) to equal length
  bool pad_shards = true;         // false: unequal shards, every sample seen once (evaluation)
  bool pin_memory = false;        // allocate batches in pinned memory (for CUDA copies)
};

struct Batch {
  at::Tensor images;   // float32 N×C×H×W
  at::Tensor labels;   // int64 N, the samples' own labels
  at::Tensor targets;  // float32 N×classes: a multi-label source's rows (mixed, when mixing is
                       // on), or the mixed soft targets of labels; else undefined
  int64_t index = 0;   // batch index within the epoch
};

class Loader {
 public:
  Loader(const Source& source, LoaderOptions options);  // source must outlive the loader
  // In-memory samples, wrapped in a TensorSource the loader owns.
  Loader(const Dataset& dataset, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t batches_per_epoch() const;
  int64_t samples_per_epoch() const;  // this rank's samples per epoch (after padding)
  // A batch's sample shape {channels, height, width}.
  std::array<int64_t, 3> sample_shape() const;
  // The source's classes, and whether its batches carry target rows (a multi-label source).
  int64_t num_classes() const;
  bool multi_label() const;
  // Samples replaced since the loader started because they could not be read.
  int64_t skipped_samples() const;
  // Starts epoch `epoch` (0-based): fixes the order and starts the workers. Any unconsumed
  // batches of the previous epoch are discarded.
  // `first_batch` > 0 continues an epoch part-way (a resumed run): the batches before it are
  // skipped without being built, and the ones after are the same as in an uninterrupted epoch.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The next batch of the current epoch in order, or nullopt at its end. Blocks until ready.
  std::optional<Batch> next();

 private:
  void start(const Source& source, const LoaderOptions& options);

  struct Impl;
  std::unique_ptr<Source> owned_;  // the wrapped Dataset (before impl_: destroyed after it)
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::data
