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
#include <string>
#include <vector>

#include "data/loader.hpp"
#include "data/transforms.hpp"

namespace kiln::data {

class BatchAssembler {
 public:
  // Throws std::invalid_argument when mean/std do not fit the source's channels. For a source
  // whose sizes vary and without a transform that fixes the output size, the first sample's
  // size is the batches' (under data.on_error = "skip", the first sample that decodes): its
  // SampleError when it cannot be read (under skip: when none can).
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
  // load_sample without a transform: decoded straight into `dst`, which the sample must fill.
  int64_t load_plain(int64_t index, uint8_t* dst) const;
  // As load_sample, and for a multi-label source its target row into `targets` (else null); a
  // SampleError replaces the sample by the next index (data.on_error "skip").
  int64_t load_or_replace(int64_t index, std::mt19937_64* gen, Scratch& scratch, uint8_t* dst,
                          float* targets) const;
  void normalise(at::Tensor& images) const;
  // The header of the sample whose size the batches take (first_index_).
  SampleHeader first_sample();
  // Throws BrokenSource, naming the source and the sample, when `s` is not `header`'s size
  // reduced by s.scale (each side rounded up).
  void check_decoded(int64_t index, const SampleHeader& header, const DecodedSample& s) const;
  // Throws std::invalid_argument naming both samples when `header` is not the first's size.
  void check_same_size(int64_t index, const SampleHeader& header) const;
  // Throws BrokenSource: "<source> broke the dataset contract: <sample> <what>".
  [[noreturn]] void broken(int64_t index, const std::string& what) const;
  // Throws std::invalid_argument: sample `index` is height x width (`after` a transform, "" for
  // none), not the first sample's size.
  [[noreturn]] void differ(int64_t index, int64_t height, int64_t width, const char* after) const;

  const Source& source_;
  LoaderOptions options_;
  int64_t channels_;
  int64_t out_h_, out_w_;     // a transformed sample, before padding/crop and flip
  bool plain_;                // a fixed-size source and no resizing transform
  bool check_sizes_ = false;  // sizes vary by the source: each sample must match the first's
  int64_t first_index_ = 0;   // the sample whose size that is
  // Cleared once pinned allocation fails, so later batches go straight to pageable memory.
  mutable std::atomic<bool> pin_;
  mutable std::atomic<int64_t> skipped_{0};
  mutable std::mutex logged_mutex_;
  mutable std::set<int64_t> logged_;  // samples whose error was logged
};

}  // namespace kiln::data
