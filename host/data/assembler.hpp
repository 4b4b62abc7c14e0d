// Builds one batch: gathers uint8 samples, applies random crop/flip, converts to normalised
// floats. Stateless apart from configuration, so any thread may build any batch.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "data/loader.hpp"

namespace kiln::data {

class BatchAssembler {
 public:
  BatchAssembler(const Dataset& dataset, const LoaderOptions& options);

  // Batch `batch_index` of `epoch` from the dataset rows `indices[0..count)`. Augmentation draws
  // depend only on (seed, epoch, batch_index). `scratch` is the caller's reusable uint8 buffer.
  Batch build(const int64_t* indices, int64_t count, int64_t epoch, int64_t batch_index,
              std::vector<uint8_t>& scratch) const;

 private:
  at::Tensor allocate(at::IntArrayRef shape, at::ScalarType dtype) const;
  void copy_sample(const uint8_t* src, uint8_t* dst, int64_t dy, int64_t dx, bool flip) const;

  at::Tensor images_;
  at::Tensor labels_;
  LoaderOptions options_;
  int64_t channels_, height_, width_;
  // Cleared once pinned allocation fails, so later batches go straight to pageable memory.
  mutable std::atomic<bool> pin_;
};

}  // namespace kiln::data
