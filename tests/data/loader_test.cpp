// The batch loader: coverage, ordering, worker-count independence, sharding, normalisation,
// augmentation, prefetch bound, restarts and error propagation.
#include "data/loader.hpp"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using kiln::data::Batch;
using kiln::data::Dataset;
using kiln::data::Loader;
using kiln::data::LoaderOptions;

namespace {

// Sample i has every pixel equal to i % 256 plus its position's row, and label i, so a batch's
// labels identify exactly which samples it holds.
Dataset tagged_dataset(int64_t n, int64_t c = 1, int64_t h = 4, int64_t w = 5) {
  at::Tensor base = at::arange(n, at::kLong).remainder(200).view({n, 1, 1, 1});
  at::Tensor rows = at::arange(h, at::kLong).view({1, 1, h, 1});
  at::Tensor images = (base + rows).expand({n, c, h, w}).to(at::kByte).contiguous();
  return Dataset{images, at::arange(n, at::kLong), n};
}

std::vector<Batch> run_epoch(Loader& loader, int64_t epoch) {
  loader.start_epoch(epoch);
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(std::move(*b));
  return out;
}

std::vector<int64_t> epoch_labels(Loader& loader, int64_t epoch) {
  std::vector<int64_t> all;
  for (const Batch& b : run_epoch(loader, epoch)) {
    const int64_t* p = b.labels.data_ptr<int64_t>();
    all.insert(all.end(), p, p + b.labels.size(0));
  }
  return all;
}

LoaderOptions opts(int workers, int64_t batch = 8) {
  LoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.seed = 42;
  return o;
}

}  // namespace

TEST(Loader, EverySampleOncePerEpoch) {
  const Dataset d = tagged_dataset(37);
  for (int workers : {0, 2}) {
    Loader loader(d, opts(workers));
    EXPECT_EQ(loader.batches_per_epoch(), 5);
    EXPECT_EQ(loader.samples_per_epoch(), 37);
    const auto batches = run_epoch(loader, 0);
    ASSERT_EQ(batches.size(), 5u);
    for (size_t i = 0; i < batches.size(); ++i) {
      EXPECT_EQ(batches[i].index, int64_t(i));
      EXPECT_EQ(batches[i].images.scalar_type(), at::kFloat);
      EXPECT_EQ(batches[i].images.sizes(), (std::vector<int64_t>{i < 4 ? 8 : 5, 1, 4, 5}));
    }
    std::vector<int64_t> labels = epoch_labels(loader, 1);
    std::sort(labels.begin(), labels.end());
    for (int64_t i = 0; i < 37; ++i) EXPECT_EQ(labels[i], i);
    // next() after the end keeps saying so.
    EXPECT_FALSE(loader.next().has_value());
  }
}

TEST(Loader, DropLast) {
  const Dataset d = tagged_dataset(37);
  LoaderOptions o = opts(1);
  o.drop_last = true;
  Loader loader(d, o);
  EXPECT_EQ(loader.batches_per_epoch(), 4);
  EXPECT_EQ(epoch_labels(loader, 0).size(), 32u);
}

TEST(Loader, OrderIsSeededPerEpoch) {
  const Dataset d = tagged_dataset(100);
  Loader a(d, opts(2));
  Loader b(d, opts(0));
  const auto a0 = epoch_labels(a, 0);
  const auto a1 = epoch_labels(a, 1);
  EXPECT_NE(a0, a1);
  EXPECT_EQ(a0, epoch_labels(b, 0));
  EXPECT_EQ(a1, epoch_labels(b, 1));
  EXPECT_EQ(a0, epoch_labels(a, 0));  // replaying an epoch replays its order

  LoaderOptions other = opts(2);
  other.seed = 43;
  Loader c(d, other);
  EXPECT_NE(a0, epoch_labels(c, 0));

  LoaderOptions fixed = opts(2);
  fixed.shuffle = false;
  Loader e(d, fixed);
  const auto ordered = epoch_labels(e, 3);
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(ordered[i], i);
}

TEST(Loader, SameBatchesForAnyWorkerCount) {
  const Dataset d = tagged_dataset(150, 3, 6, 7);
  for (bool augment : {false, true}) {
    SCOPED_TRACE(augment ? "crop+flip" : "plain");
    std::vector<std::vector<Batch>> runs;
    for (int workers : {0, 1, 3}) {
      LoaderOptions o = opts(workers, 16);
      o.prefetch = 2;
      o.mean = {0.3};
      o.std = {0.7};
      if (augment) {
        o.crop_padding = 2;
        o.flip = true;
      }
      Loader loader(d, o);
      run_epoch(loader, 0);  // runs[] compares epoch 1: the epoch's key matters too
      runs.push_back(run_epoch(loader, 1));
    }
    for (size_t r = 1; r < runs.size(); ++r) {
      ASSERT_EQ(runs[r].size(), runs[0].size());
      for (size_t i = 0; i < runs[0].size(); ++i) {
        EXPECT_TRUE(at::equal(runs[r][i].images, runs[0][i].images)) << "batch " << i;
        EXPECT_TRUE(at::equal(runs[r][i].labels, runs[0][i].labels)) << "batch " << i;
      }
    }
  }
}

TEST(Loader, ShardsAreDisjointPaddedAndCovering) {
  const Dataset d = tagged_dataset(25);
  std::vector<std::vector<int64_t>> shards;
  for (int rank : {0, 1}) {
    LoaderOptions o = opts(2, 4);
    o.rank = rank;
    o.world_size = 2;
    Loader loader(d, o);
    EXPECT_EQ(loader.samples_per_epoch(), 13);
    EXPECT_EQ(loader.batches_per_epoch(), 4);
    shards.push_back(epoch_labels(loader, 5));
  }
  ASSERT_EQ(shards[0].size(), 13u);
  ASSERT_EQ(shards[1].size(), 13u);
  // 26 slots for 25 samples: exactly one sample (the wrap-around pad) appears twice.
  std::multiset<int64_t> all(shards[0].begin(), shards[0].end());
  all.insert(shards[1].begin(), shards[1].end());
  std::set<int64_t> distinct(all.begin(), all.end());
  EXPECT_EQ(distinct.size(), 25u);
  EXPECT_EQ(*distinct.begin(), 0);
  EXPECT_EQ(*distinct.rbegin(), 24);
  // Disjoint apart from that pad, which is the last entry of rank 1 and rank 0's first sample
  // (the permutation wrapped around).
  EXPECT_EQ(shards[1].back(), shards[0].front());
  std::set<int64_t> r0(shards[0].begin(), shards[0].end());
  for (size_t i = 0; i + 1 < shards[1].size(); ++i) EXPECT_EQ(r0.count(shards[1][i]), 0u);
}

TEST(Loader, UnpaddedShardsSeeEverySampleOnce) {
  // Evaluation: 25 samples on 3 ranks are 9 + 8 + 8, no sample twice.
  const Dataset d = tagged_dataset(25);
  std::multiset<int64_t> all;
  for (int rank : {0, 1, 2}) {
    LoaderOptions o = opts(2, 4);
    o.rank = rank;
    o.world_size = 3;
    o.pad_shards = false;
    Loader loader(d, o);
    EXPECT_EQ(loader.samples_per_epoch(), rank == 0 ? 9 : 8);
    const std::vector<int64_t> labels = epoch_labels(loader, 5);
    EXPECT_EQ(static_cast<int64_t>(labels.size()), loader.samples_per_epoch());
    all.insert(labels.begin(), labels.end());
  }
  EXPECT_EQ(all.size(), 25u);
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 25u);
}

TEST(Loader, Normalisation) {
  const Dataset d = tagged_dataset(10, 2, 3, 3);
  LoaderOptions o = opts(1, 10);
  o.shuffle = false;
  o.mean = {0.25};
  o.std = {0.5};
  Loader loader(d, o);
  loader.start_epoch(0);
  const Batch b = *loader.next();
  const at::Tensor expected = (d.images.to(at::kDouble) / 255.0 - 0.25) / 0.5;
  EXPECT_TRUE(at::allclose(b.images.to(at::kDouble), expected, 1e-6, 1e-6));
  EXPECT_TRUE(at::equal(b.labels, d.labels));
  // Spot check: sample 3, row 2 holds pixel value 5.
  EXPECT_NEAR(b.images[3][1][2][0].item<double>(), (5 / 255.0 - 0.25) / 0.5, 1e-6);
}

TEST(Loader, CropAndFlipMoveRealPixels) {
  // One sample with distinct pixel values so every crop/flip outcome is recognisable.
  const int64_t h = 4, w = 5, pad = 1;
  at::Tensor img = at::arange(1, 1 + h * w, at::kLong).view({1, 1, h, w}).to(at::kByte);
  const Dataset d{img.repeat({64, 1, 1, 1}).contiguous(), at::zeros({64}, at::kLong), 1};
  LoaderOptions o = opts(0, 64);
  o.crop_padding = pad;
  o.flip = true;
  Loader loader(d, o);
  loader.start_epoch(0);
  const at::Tensor out = (loader.next()->images * 255).round().to(at::kLong);
  // Build every allowed outcome and check each sample is one of them; many should differ.
  const at::Tensor padded = at::constant_pad_nd(img.to(at::kLong), {pad, pad, pad, pad}, 0);
  std::vector<at::Tensor> outcomes;
  for (int64_t dy = 0; dy <= 2 * pad; ++dy) {
    for (int64_t dx = 0; dx <= 2 * pad; ++dx) {
      at::Tensor crop = padded.slice(2, dy, dy + h).slice(3, dx, dx + w);
      outcomes.push_back(crop[0]);
      outcomes.push_back(crop[0].flip({2}));
    }
  }
  std::set<size_t> seen;
  for (int64_t i = 0; i < 64; ++i) {
    bool found = false;
    for (size_t k = 0; k < outcomes.size() && !found; ++k) {
      if (at::equal(out[i], outcomes[k])) {
        found = true;
        seen.insert(k);
      }
    }
    EXPECT_TRUE(found) << "sample " << i << " is no crop/flip of the input";
  }
  EXPECT_GE(seen.size(), 8u);  // 18 outcomes, 64 draws
}

// Wraps the CPU allocator to count allocations of one size: the loader allocates each batch's
// float images exactly once, so this counts batches built, which must stay within `prefetch`
// of the batches consumed.
class CountingAllocator : public c10::Allocator {
 public:
  CountingAllocator(c10::Allocator* base, size_t watched) : base_(base), watched_(watched) {}
  c10::DataPtr allocate(size_t n) override {
    if (n == watched_) ++count_;
    return base_->allocate(n);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }
  int count() const { return count_.load(); }

 private:
  c10::Allocator* base_;
  size_t watched_;
  std::atomic<int> count_{0};
};

// Waits (up to a generous limit, the machine is shared) for `count` to reach `target`, then a
// little longer so that any overshoot would show.
int settle(const CountingAllocator& alloc, int target) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (alloc.count() < target && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  return alloc.count();
}

TEST(Loader, PrefetchIsBounded) {
  // 3×7×11 float images × batch 4: 3696 bytes, a size nothing else here allocates.
  const Dataset d = tagged_dataset(400, 3, 7, 11);
  c10::Allocator* base = c10::GetCPUAllocator();
  CountingAllocator counting(base, 4 * 3 * 7 * 11 * sizeof(float));
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  {
    LoaderOptions o = opts(3, 4);
    o.prefetch = 3;
    Loader loader(d, o);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    EXPECT_EQ(counting.count(), 0);  // nothing is built before start_epoch
    loader.start_epoch(0);
    EXPECT_EQ(settle(counting, 3), 3);
    for (int consumed = 1; consumed <= 5; ++consumed) {
      ASSERT_EQ(loader.next()->index, consumed - 1);
      EXPECT_EQ(settle(counting, consumed + 3), consumed + 3);
    }
    int64_t expected = 5;
    while (auto b = loader.next()) EXPECT_EQ(b->index, expected++);
    EXPECT_EQ(expected, 100);
    EXPECT_EQ(counting.count(), 100);
  }
  c10::SetCPUAllocator(base, /*priority=*/100);
}

TEST(Loader, RestartMidEpoch) {
  const Dataset d = tagged_dataset(200);
  for (int workers : {0, 3}) {
    LoaderOptions o = opts(workers, 8);
    o.prefetch = 2;
    Loader loader(d, o);
    Loader reference(d, opts(0, 8));
    const auto full1 = epoch_labels(reference, 1);
    loader.start_epoch(0);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader.next().has_value());
    EXPECT_EQ(epoch_labels(loader, 1), full1);
    // Restart the same epoch after a partial read, then abandon one mid-way entirely.
    loader.start_epoch(1);
    ASSERT_EQ(loader.next()->index, 0);
    EXPECT_EQ(epoch_labels(loader, 1), full1);
    loader.start_epoch(2);
    ASSERT_TRUE(loader.next().has_value());
  }  // destructor joins with work outstanding
}

// A source whose samples 3 and 11 cannot be decoded.
class FailingSource final : public kiln::data::Source {
 public:
  explicit FailingSource(const Dataset& d) : inner_(d.images, d.labels, d.num_classes) {}
  int64_t size() const override { return inner_.size(); }
  int64_t num_classes() const override { return inner_.num_classes(); }
  int64_t channels() const override { return inner_.channels(); }
  int64_t fixed_height() const override { return inner_.fixed_height(); }
  int64_t fixed_width() const override { return inner_.fixed_width(); }
  kiln::data::SampleHeader probe(int64_t i) const override { return inner_.probe(i); }
  kiln::data::DecodedSample decode(int64_t i, int scale, uint8_t* pixels,
                                   size_t capacity) const override {
    if (i == 3 || i == 11) {
      throw kiln::data::SampleError("/data/sample_" + std::to_string(i) + ".jpg: truncated");
    }
    return inner_.decode(i, scale, pixels, capacity);
  }

 private:
  kiln::data::TensorSource inner_;
};

TEST(Loader, WorkerErrorSurfacesFromNext) {
  const Dataset good = tagged_dataset(20);
  const FailingSource bad(good);
  for (int workers : {0, 2}) {
    LoaderOptions o = opts(workers, 8);
    o.shuffle = false;
    Loader loader(bad, o);
    loader.start_epoch(0);
    try {
      loader.next();
      ADD_FAILURE() << "no error";
    } catch (const kiln::data::SampleError& e) {
      EXPECT_NE(std::string(e.what()).find("sample_3.jpg"), std::string::npos) << e.what();
    }
  }
  for (int workers : {0, 2}) {
    // The failure does not poison the loader: the rest of the epoch still reports errors
    // one batch at a time (batches 0 and 1 hold a bad sample), then the epoch ends.
    LoaderOptions o = opts(workers, 8);
    o.shuffle = false;
    Loader loader(bad, o);
    loader.start_epoch(0);
    int errors = 0;
    for (int i = 0; i < 3; ++i) {
      try {
        loader.next();
      } catch (const std::exception&) {
        ++errors;
      }
    }
    EXPECT_EQ(errors, 2);
    EXPECT_FALSE(loader.next().has_value());
  }
}

TEST(Loader, SkippedSamplesAreReplacedByTheNextIndexAndCounted) {
  const Dataset good = tagged_dataset(20);
  const FailingSource bad(good);
  for (int workers : {0, 2}) {
    LoaderOptions o = opts(workers, 20);
    o.shuffle = false;
    o.skip_bad_samples = true;
    Loader loader(bad, o);
    const std::vector<int64_t> labels = epoch_labels(loader, 0);
    ASSERT_EQ(labels.size(), 20u);
    for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(labels[i], (i == 3 || i == 11) ? i + 1 : i);
    EXPECT_EQ(loader.skipped_samples(), 2);
  }
}

// The threads of this process (the Threads: line of /proc/self/status).
int64_t thread_count() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::stoll(line.substr(8));
  }
  return -1;
}

// A worker's batch conversion runs ATen kernels that would open an OpenMP region: the worker
// must not start a team of intra-op threads of its own (they spin beside the trainer's and take
// its cores). Two workers over batches large enough for a parallel kernel add two threads.
TEST(Loader, WorkersStartNoIntraOpThreadsOfTheirOwn) {
  const int threads_before = at::get_num_threads();
  at::set_num_threads(2);
  (void)at::ones({1 << 20}).sum();  // this thread's team exists before counting
  const int64_t before = thread_count();
  {
    Loader loader(tagged_dataset(512, 3, 32, 32), opts(2, 64));  // 196K elements a batch
    EXPECT_EQ(epoch_labels(loader, 0).size(), 512u);
    EXPECT_EQ(thread_count(), before + 2);
  }
  at::set_num_threads(threads_before);
}

TEST(Loader, RejectsBadOptions) {
  const Dataset d = tagged_dataset(10);
  LoaderOptions o = opts(1);
  o.rank = 2;
  o.world_size = 2;
  EXPECT_THROW(Loader l(d, o), std::invalid_argument);
  o = opts(1);
  o.batch_size = 0;
  EXPECT_THROW(Loader l(d, o), std::invalid_argument);
  Loader fine(d, opts(1));
  EXPECT_THROW(fine.next(), std::logic_error);
}

namespace {

// Samples of different sizes (an image folder's): sample i is (20 + 7 i % 50) x (30 + 11 i % 40)
// x 3, reduced on request by averaging scale x scale blocks (sides rounded up), as a JPEG
// decoder's DCT scaling would; counts the reductions asked for.
class VaryingSource final : public kiln::data::Source {
 public:
  explicit VaryingSource(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  int64_t num_classes() const override { return 4; }
  int64_t channels() const override { return 3; }
  int64_t fixed_height() const override { return 0; }
  int64_t fixed_width() const override { return 0; }
  kiln::data::SampleHeader probe(int64_t i) const override {
    return {20 + (7 * i) % 50, 30 + (11 * i) % 40, i % 4};
  }
  kiln::data::DecodedSample decode(int64_t i, int scale, uint8_t* pixels,
                                   size_t capacity) const override {
    const auto h = probe(i);
    ++asked_[scale];
    const int64_t rh = (h.height + scale - 1) / scale, rw = (h.width + scale - 1) / scale;
    if (capacity < size_t(rh * rw * 3)) throw std::invalid_argument("small buffer");
    for (int64_t y = 0; y < rh; ++y) {
      for (int64_t x = 0; x < rw; ++x) {
        for (int64_t c = 0; c < 3; ++c) {
          pixels[(y * rw + x) * 3 + c] =
              uint8_t((y * scale * 3 + x * scale * 5 + c * 40 + i) % 256);
        }
      }
    }
    return {rh, rw, h.label, int(scale)};
  }
  int64_t asked(int scale) const { return asked_[scale].load(); }

 private:
  int64_t n_;
  mutable std::atomic<int64_t> asked_[9] = {};
};

LoaderOptions augmenting(int workers) {
  LoaderOptions o = opts(workers, 8);
  o.rrc_size = 16;
  o.crop_padding = 2;
  o.flip = true;
  o.mean = {0.5, 0.4, 0.3};
  o.std = {0.2, 0.25, 0.3};
  o.mix.mixup_alpha = 0.8;
  o.mix.cutmix_alpha = 1.0;
  o.mix.prob = 0.9;
  return o;
}

}  // namespace

// Without a crop, a source whose sizes may vary (a folder) is taken at sample 0's size, and the
// first sample of another size stops the loader with the advice (not skipped: a crop is needed).
TEST(Loader, SamplesOfDifferentSizesNeedACropOrResize) {
  const VaryingSource source(10);
  for (const int64_t resize : {int64_t{0}, int64_t{24}}) {
    LoaderOptions o = opts(0);
    o.resize = resize;  // a resize alone leaves sizes differing too
    Loader loader(source, o);
    loader.start_epoch(0);
    try {
      (void)loader.next();
      ADD_FAILURE() << "no error (resize " << resize << ")";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("samples differ in size: set "
                                           "data.random_resized_crop or data.resize + "
                                           "data.center_crop"),
                std::string::npos)
          << e.what();
    }
  }
  LoaderOptions o = opts(0);
  o.resize = 24;
  o.center_crop = 20;
  Loader eval(source, o);
  EXPECT_EQ(eval.sample_shape(), (std::array<int64_t, 3>{3, 20, 20}));
  eval.start_epoch(0);
  EXPECT_EQ(eval.next()->images.sizes(), (std::vector<int64_t>{8, 3, 20, 20}));
}

namespace {

// VaryingSource's samples behind files: sample i is "img_<i>.png", and those listed in `broken`
// cannot be read (a SampleError from probe and decode, as an empty file named .jpg gives);
// `liar` decodes a row fewer than its header says.
class FileSource final : public kiln::data::Source {
 public:
  FileSource(int64_t n, std::set<int64_t> broken, int64_t liar = -1)
      : inner_(n), broken_(std::move(broken)), liar_(liar) {}
  int64_t size() const override { return inner_.size(); }
  int64_t num_classes() const override { return 4; }
  int64_t channels() const override { return 3; }
  int64_t fixed_height() const override { return 0; }
  int64_t fixed_width() const override { return 0; }
  std::string sample_name(int64_t i) const override {
    return "sample " + std::to_string(i) + " (img_" + std::to_string(i) + ".png)";
  }
  std::string provider() const override { return "dataset 'files'"; }
  kiln::data::SampleHeader probe(int64_t i) const override {
    if (broken_.count(i) != 0)
      throw kiln::data::SampleError("img_" + std::to_string(i) + ".png: empty");
    return inner_.probe(i);
  }
  kiln::data::DecodedSample decode(int64_t i, int scale, uint8_t* pixels,
                                   size_t capacity) const override {
    (void)probe(i);
    kiln::data::DecodedSample s = inner_.decode(i, scale, pixels, capacity);
    if (i == liar_) --s.height;
    return s;
  }

 private:
  VaryingSource inner_;
  std::set<int64_t> broken_;
  int64_t liar_;
};

}  // namespace

// Under data.on_error = "skip" the batches take the size of the first sample that decodes, so an
// unreadable file sorted first is skipped as one anywhere else is; under "stop" it stops the
// loader, and when nothing can be read the first error is given.
TEST(Loader, UnderSkipTheFirstReadableSampleGivesTheSize) {
  const FileSource source(10, {0, 1});
  LoaderOptions o = opts(0);
  o.skip_bad_samples = true;
  const kiln::data::SampleHeader third = VaryingSource(10).probe(2);
  EXPECT_EQ(Loader(source, o).sample_shape(),
            (std::array<int64_t, 3>{3, third.height, third.width}));
  // Two samples replaced (0 by 2 past 1, and 1 by 2): counted as two, not as every try.
  LoaderOptions whole = o;
  whole.batch_size = 3;
  whole.shuffle = false;
  whole.resize = whole.center_crop = 16;
  Loader counting(source, whole);
  counting.start_epoch(0);
  ASSERT_TRUE(counting.next().has_value());
  EXPECT_EQ(counting.skipped_samples(), 2);
  o.skip_bad_samples = false;
  EXPECT_THROW(Loader(source, o), kiln::data::SampleError);
  o.skip_bad_samples = true;
  try {
    Loader none(FileSource(3, {0, 1, 2}), o);
    ADD_FAILURE() << "no error";
  } catch (const kiln::data::SampleError& e) {
    EXPECT_NE(std::string(e.what()).find("none of the 3 samples can be read "
                                         "(data.on_error = \"skip\"); the first: img_0.png: "
                                         "empty"),
              std::string::npos)
        << e.what();
  }
}

// Two sizes without a crop: both samples are named, the one met and the one that set the size.
TEST(Loader, SamplesOfDifferentSizesAreNamedBoth) {
  const FileSource source(10, {0});  // sample 1 sets the size
  LoaderOptions o = opts(0, 3);
  o.skip_bad_samples = true;
  o.shuffle = false;
  Loader loader(source, o);
  loader.start_epoch(0);
  try {
    (void)loader.next();
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    const auto one = VaryingSource(10).probe(1), two = VaryingSource(10).probe(2);
    EXPECT_NE(
        std::string(e.what()).find("sample 2 (img_2.png) is " + std::to_string(two.height) + "x" +
                                   std::to_string(two.width) + ", sample 1 (img_1.png) " +
                                   std::to_string(one.height) + "x" + std::to_string(one.width) +
                                   ": samples differ in size"),
        std::string::npos)
        << e.what();
  }
}

// A source that decodes another size than its header says broke its contract: a BrokenSource
// naming it and the sample (never skipped), met in a batch with a crop, or when the first
// sample sets the batches' size without one.
TEST(Loader, ADecodeOfAnotherSizeThanTheHeaderBreaksTheContract) {
  const FileSource source(10, {}, /*liar=*/0);
  for (const int64_t crop : {int64_t{0}, int64_t{16}}) {
    LoaderOptions o = opts(0, 2);
    o.shuffle = false;
    o.skip_bad_samples = true;
    o.resize = crop;
    o.center_crop = crop;
    try {
      Loader loader(source, o);
      loader.start_epoch(0);
      (void)loader.next();
      ADD_FAILURE() << "no error (crop " << crop << ")";
    } catch (const kiln::data::BrokenSource& e) {
      EXPECT_NE(std::string(e.what()).find("dataset 'files' broke the dataset contract: sample 0 "
                                           "(img_0.png) decoded as 19x30 at scale 1/1; probe "
                                           "reported 20x30"),
                std::string::npos)
          << e.what();
    }
  }
}

// The mixing run's batches: soft targets N x classes whose rows sum to 1 and hold the sample's
// own class and its partner's (the reversed batch) only.
TEST(Loader, MixedBatchesCarrySoftTargets) {
  const VaryingSource source(40);
  Loader loader(source, augmenting(0));
  int mixed = 0;
  for (const Batch& b : run_epoch(loader, 0)) {
    ASSERT_TRUE(b.targets.defined());
    ASSERT_EQ(b.targets.sizes(), (std::vector<int64_t>{b.labels.size(0), 4}));
    EXPECT_TRUE(at::allclose(b.targets.sum(1), at::ones({b.labels.size(0)})));
    const at::Tensor own = b.targets.gather(1, b.labels.view({-1, 1})).squeeze(1);
    const at::Tensor partner = b.targets.gather(1, b.labels.flip(0).view({-1, 1})).squeeze(1);
    const at::Tensor same = b.labels.eq(b.labels.flip(0));
    EXPECT_TRUE(at::allclose(at::where(same, own, own + partner), at::ones_like(own)));
    if (own.min().item<float>() < 1.0f) ++mixed;
  }
  EXPECT_GE(mixed, 2);
  // Without mixing there are no targets.
  Loader plain(source, [] {
    LoaderOptions o = augmenting(0);
    o.mix = {};
    return o;
  }());
  plain.start_epoch(0);
  EXPECT_FALSE(plain.next()->targets.defined());
}

// A multi-label source's batches carry its target rows in sample order (labels 0); mixed, the
// rows are mixed with the batch flipped by the lambda the images were mixed with.
TEST(Loader, MultiLabelBatchesCarryTheirRowsMixedAsTheirImages) {
  const int64_t n = 24, classes = 3;
  Dataset d = tagged_dataset(n);
  at::Tensor rows = at::zeros({n, classes}, at::kFloat);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < classes; ++k) rows[i][k] = static_cast<float>(((i + 1) >> k) & 1);
  }
  d.labels = rows;
  d.num_classes = classes;
  LoaderOptions o = opts(2, 8);
  o.shuffle = false;
  Loader loader(d, o);
  const std::vector<Batch> plain = run_epoch(loader, 0);
  ASSERT_EQ(plain.size(), 3u);
  for (size_t j = 0; j < plain.size(); ++j) {
    ASSERT_TRUE(plain[j].targets.defined());
    EXPECT_TRUE(at::equal(plain[j].targets, rows.narrow(0, static_cast<int64_t>(j) * 8, 8)));
    EXPECT_EQ(plain[j].labels.abs().sum().item<int64_t>(), 0);
  }
  o.mix.mixup_alpha = 1.0;
  Loader mixing(d, o);
  const std::vector<Batch> mixed = run_epoch(mixing, 0);
  ASSERT_EQ(mixed.size(), plain.size());
  for (size_t j = 0; j < mixed.size(); ++j) {
    // The images' lambda: x' = lambda x + (1 - lambda) flip(x), at a pixel where x and its
    // partner differ (all do here: sample i's pixels hold i).
    const at::Tensor x = plain[j].images, partner = plain[j].images.flip(0);
    const double lambda = ((mixed[j].images - partner) / (x - partner)).flatten()[0].item<double>();
    const at::Tensor r = plain[j].targets;
    EXPECT_TRUE(at::allclose(mixed[j].targets, r * lambda + r.flip(0) * (1.0 - lambda), 1e-5, 1e-6))
        << "batch " << j << ", lambda " << lambda;
  }
}

// A resumed epoch (start_epoch(e, k)) gets the batches, augmentations and mixing of an
// uninterrupted one from batch k on, whichever worker count builds them.
TEST(Loader, ResumedEpochHasTheUninterruptedEpochsAugmentedBatches) {
  const VaryingSource source(60);
  Loader whole(source, augmenting(0));
  run_epoch(whole, 0);
  const std::vector<Batch> full = run_epoch(whole, 2);
  ASSERT_EQ(full.size(), 8u);
  for (int workers : {0, 3}) {
    Loader resumed(source, augmenting(workers));
    resumed.start_epoch(2, 3);
    for (size_t i = 3; i < full.size(); ++i) {
      const auto b = resumed.next();
      ASSERT_TRUE(b.has_value());
      EXPECT_EQ(b->index, int64_t(i));
      EXPECT_TRUE(at::equal(b->images, full[i].images)) << "batch " << i;
      EXPECT_TRUE(at::equal(b->labels, full[i].labels)) << "batch " << i;
      EXPECT_TRUE(at::equal(b->targets, full[i].targets)) << "batch " << i;
    }
    EXPECT_FALSE(resumed.next().has_value());
  }
  // And another epoch differs.
  EXPECT_FALSE(at::equal(run_epoch(whole, 3)[0].images, full[0].images));
}

// decode_scale "auto" asks for 1/2, 1/4 or 1/8 where the crop allows it; "full" never does.
TEST(Loader, ScaledDecodingOnlyWhereTheCropAllows) {
  const VaryingSource source(64);
  LoaderOptions o = opts(0, 16);
  o.rrc_size = 8;
  o.rrc_scale = {0.5, 1.0};
  {
    Loader loader(source, o);
    run_epoch(loader, 0);
    EXPECT_GT(source.asked(2) + source.asked(4), 0);
    EXPECT_EQ(source.asked(8), 0);  // no sample is 64 pixels on both sides
  }
  const VaryingSource full_source(64);
  o.decode_scaled = false;
  Loader loader(full_source, o);
  const auto batches = run_epoch(loader, 0);
  EXPECT_EQ(full_source.asked(1), 64);
  EXPECT_EQ(batches[0].images.sizes(), (std::vector<int64_t>{16, 3, 8, 8}));
}

// The loader before data::Source (commit ec426b3's BatchAssembler), written out: with no new
// option set, batches stay bit-identical to it, so runs and checkpoints keep their numbers.
TEST(Loader, PlainBatchesAreTheEarlierLoadersBitForBit) {
  const int64_t c = 3, h = 6, w = 7, pad = 2, n = 50;
  at::manual_seed(5);
  const Dataset d{at::randint(0, 256, {n, c, h, w}, at::kByte), at::arange(n, at::kLong), n};
  for (bool augment : {false, true}) {
    LoaderOptions o = opts(2, 16);
    o.shuffle = false;
    o.mean = {0.286};
    o.std = {0.353};
    o.crop_padding = augment ? pad : 0;
    o.flip = augment;
    Loader loader(d, o);
    const std::vector<Batch> batches = run_epoch(loader, 1);
    for (const Batch& b : batches) {
      const uint64_t s = o.seed, e = 1, bi = uint64_t(b.index);
      std::vector<uint32_t> words{uint32_t(s),  uint32_t(s >> 32),  uint32_t(e), uint32_t(e >> 32),
                                  uint32_t(bi), uint32_t(bi >> 32), 0x61756735u};
      std::seed_seq seq(words.begin(), words.end());
      std::mt19937_64 gen(seq);
      const int64_t count = b.labels.size(0);
      at::Tensor want = at::zeros({count, c, h, w}, at::kByte);
      for (int64_t i = 0; i < count; ++i) {
        const at::Tensor src = d.images[b.index * 16 + i];
        if (!augment) {
          want[i].copy_(src);
          continue;
        }
        const auto offsets = uint64_t(2 * pad + 1);
        const int64_t dy = int64_t(gen() % offsets), dx = int64_t(gen() % offsets);
        const bool flip = (gen() & 1) != 0;
        at::Tensor crop = at::constant_pad_nd(src, {pad, pad, pad, pad}, 0)
                              .slice(1, dy, dy + h)
                              .slice(2, dx, dx + w);
        want[i].copy_(flip ? crop.flip({2}) : crop);
      }
      at::Tensor images = at::empty({count, c, h, w}, at::kFloat);
      images.copy_(want);
      images.div_(255.0).sub_(0.286).div_(0.353);
      EXPECT_TRUE(at::equal(b.images, images)) << "batch " << b.index << (augment ? " aug" : "");
    }
  }
}
