// Builds one batch: decodes the samples from the source, applies the configured transforms,
// converts to normalised floats and mixes. Stateless apart from configuration and counters, so
// any thread may build any batch.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#include "data/loader.hpp"
#include "data/transforms.hpp"

namespace kiln::data {

class BatchAssembler {
 public:
  // Throws std::invalid_argument when samples differ in size and no transform fixes the output
  // size, or mean/std do not fit the source's channels.
  BatchAssembler(const Source& source, const LoaderOptions& options);

  // The caller's reusable buffers (one set per thread).
  struct Scratch {
    std::vector<uint8_t> batch;   // the batch's samples, HWC uint8, back to back
    std::vector<uint8_t> decode;  // one decoded sample
    std::vector<uint8_t> sample;  // one transformed sample before padding/crop and flip
  };

  // Batch `batch_index` of `epoch` from the source's samples `indices[0..count)`. Augmentation
  // draws depend only on (seed, epoch, batch_index[, rank]).
  Batch build(const int64_t* indices, int64_t count, int64_t epoch, int64_t batch_index,
              Scratch& scratch) const;

  std::array<int64_t, 3> sample_shape() const { return {channels_, out_h_, out_w_}; }
  int64_t skipped() const { return skipped_.load(); }

 private:
  at::Tensor allocate(at::IntArrayRef shape, at::ScalarType dtype) const;
  std::mt19937_64 stream(int64_t epoch, int64_t batch_index, uint32_t tag) const;
  // Decodes and transforms sample `index` into `dst` (out_h x out_w x C); its label.
  int64_t load_sample(int64_t index, std::mt19937_64* gen, Scratch& scratch, uint8_t* dst) const;
  // As load_sample, and for a multi-label source its target row into `targets` (else null); a
  // SampleError replaces the sample by the next index (data.on_error "skip").
  int64_t load_or_replace(int64_t index, std::mt19937_64* gen, Scratch& scratch, uint8_t* dst,
                          float* targets) const;
  void normalise(at::Tensor& images) const;

  const Source& source_;
  LoaderOptions options_;
  int64_t channels_;
  int64_t out_h_, out_w_;     // a transformed sample, before padding/crop and flip
  bool plain_;                // a fixed-size source and no resizing transform
  bool check_sizes_ = false;  // sizes vary by the source: each sample must match sample 0's
  // Cleared once pinned allocation fails, so later batches go straight to pageable memory.
  mutable std::atomic<bool> pin_;
  mutable std::atomic<int64_t> skipped_{0};
  mutable std::mutex logged_mutex_;
  mutable std::set<int64_t> logged_;  // samples whose error was logged
};

}  // namespace kiln::data
