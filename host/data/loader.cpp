#include "data/loader.hpp"

#include <ATen/Parallel.h>
#include <c10/util/ParallelGuard.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "data/assembler.hpp"
#include "data/sampler.hpp"

// OpenMP's per-thread team size, from the libgomp torch loads (weak: a build of torch without
// OpenMP leaves it null). Kiln itself is not compiled with OpenMP.
extern "C" void omp_set_num_threads(int) __attribute__((weak));

namespace kiln::data {
namespace {

// A loader thread runs ATen's element-wise kernels (the batch's conversion and normalisation),
// whose parallel_for opens an OpenMP region: on this thread that would start a second team of
// intra-op threads, which then spin beside the trainer's team and take its cores (on 2 cores,
// one worker cut the small CNN's steps/s by a fifth). c10::ParallelGuard does not stop it: the
// OpenMP backend's in_parallel_region asks OpenMP alone. One thread per team here: none extra.
void one_openmp_thread() {
  if (omp_set_num_threads == nullptr) return;
  // Torch sets a thread's OpenMP team size when the thread first asks for its thread count:
  // ask first, so that the setting below is the one that stays.
  (void)at::get_num_threads();
  omp_set_num_threads(1);
}

// One epoch's fixed order; shared so a worker finishing a stale batch never sees it change.
struct EpochPlan {
  int64_t epoch = 0;
  std::vector<int64_t> order;  // this rank's dataset indices
  int64_t num_batches = 0;
};

// A finished batch (or the error that replaced it) waiting for the consumer.
struct Slot {
  bool ready = false;
  Batch batch;
  std::exception_ptr error;
};

// The dataset as a TensorSource (which checks dtypes, ranks and labels).
std::unique_ptr<Source> wrap(const Dataset& d) {
  if (!d.images.defined() || !d.labels.defined()) {
    throw std::invalid_argument("Loader: dataset images and labels must be defined");
  }
  if (d.images.dim() != 4 || !d.images.is_cpu()) {
    throw std::invalid_argument("Loader: dataset images must be a CPU N×C×H×W tensor");
  }
  return std::make_unique<TensorSource>(d.images, d.labels, d.num_classes);
}

void check_options(const LoaderOptions& o) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("Loader: " + what); };
  if (o.batch_size <= 0) fail("batch_size must be positive");
  if (o.workers < 0) fail("workers must be >= 0");
  if (o.prefetch <= 0) fail("prefetch must be positive");
  if (o.crop_padding < 0) fail("crop_padding must be >= 0");
  for (double s : o.std) {
    if (!(s > 0.0) && !(s < 0.0)) fail("std must be non-zero");
  }
  if (o.mean.empty() || o.std.empty()) fail("mean and std need a value");
  if (o.rrc_size < 0 || o.resize < 0 || o.center_crop < 0) fail("sizes must be >= 0");
  for (const auto& range : {o.rrc_scale, o.rrc_ratio}) {
    if (!(range[0] > 0.0) || !(range[0] <= range[1])) {
      fail("a random_resized_crop range must be 0 < lo <= hi");
    }
  }
  if (o.world_size <= 0 || o.rank < 0 || o.rank >= o.world_size) {
    fail("rank " + std::to_string(o.rank) + " is not in [0, world_size " +
         std::to_string(o.world_size) + ")");
  }
}

}  // namespace

struct Loader::Impl {
  Impl(const Source& source, const LoaderOptions& opts)
      : source(source),
        options(opts),
        assembler(source, opts),
        dataset_size(source.size()),
        samples(shard_size(dataset_size, opts.world_size, opts.rank, opts.pad_shards)),
        batches(opts.drop_last ? samples / opts.batch_size
                               : (samples + opts.batch_size - 1) / opts.batch_size),
        slots(static_cast<size_t>(opts.prefetch)) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    work_cv.notify_all();
    for (std::thread& t : threads) t.join();
  }

  Batch build(const EpochPlan& plan, int64_t b, BatchAssembler::Scratch& scratch) const {
    const int64_t first = b * options.batch_size;
    const int64_t count = std::min(options.batch_size, samples - first);
    return assembler.build(plan.order.data() + first, count, plan.epoch, b, scratch);
  }

  // Workers claim the lowest unclaimed batch within `prefetch` of the consumer, build it without
  // the lock, and publish it unless start_epoch replaced the epoch meanwhile.
  void worker_loop() {
    // Each worker is the parallelism; keep ATen from fanning out intra-op threads underneath.
    c10::ParallelGuard serial(true);
    one_openmp_thread();
    BatchAssembler::Scratch scratch;
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      work_cv.wait(lock, [&] {
        return stopping || (plan && claimed < plan->num_batches && claimed < consumed + prefetch());
      });
      if (stopping) return;
      const int64_t b = claimed++;
      const uint64_t gen = generation;
      std::shared_ptr<const EpochPlan> mine = plan;
      lock.unlock();
      Slot result;
      try {
        result.batch = build(*mine, b, scratch);
      } catch (...) {
        result.error = std::current_exception();
      }
      result.ready = true;
      lock.lock();
      if (gen != generation) continue;  // cancelled by start_epoch: drop it
      slots[static_cast<size_t>(b % prefetch())] = std::move(result);
      ready_cv.notify_all();
    }
  }

  int64_t prefetch() const { return options.prefetch; }

  const Source& source;
  LoaderOptions options;
  BatchAssembler assembler;
  int64_t dataset_size;
  int64_t samples;
  int64_t batches;

  std::mutex mutex;
  std::condition_variable work_cv;   // workers: a batch may be claimed, or stop
  std::condition_variable ready_cv;  // consumer: a slot was filled
  bool stopping = false;
  uint64_t generation = 0;  // bumped by start_epoch; stale results are discarded
  std::shared_ptr<const EpochPlan> plan;
  int64_t claimed = 0;              // next batch index a worker will take
  int64_t consumed = 0;             // next batch index next() returns
  std::vector<Slot> slots;          // ring of `prefetch` entries, batch b at b % prefetch
  BatchAssembler::Scratch scratch;  // the caller's buffers when workers == 0
  std::vector<std::thread> threads;
};

Loader::Loader(const Dataset& dataset, LoaderOptions options) : owned_(wrap(dataset)) {
  start(*owned_, options);
}

Loader::Loader(const Source& source, LoaderOptions options) { start(source, options); }

void Loader::start(const Source& source, const LoaderOptions& options) {
  check_options(options);
  impl_ = std::make_unique<Impl>(source, options);
  // Threads start idle; if creating one fails, ~Impl joins those already running.
  for (int i = 0; i < options.workers; ++i) {
    impl_->threads.emplace_back([impl = impl_.get()] { impl->worker_loop(); });
  }
}

Loader::~Loader() = default;

int64_t Loader::batches_per_epoch() const { return impl_->batches; }

int64_t Loader::samples_per_epoch() const { return impl_->samples; }

std::array<int64_t, 3> Loader::sample_shape() const { return impl_->assembler.sample_shape(); }

int64_t Loader::num_classes() const { return impl_->source.num_classes(); }

bool Loader::multi_label() const { return impl_->source.multi_label(); }

int64_t Loader::skipped_samples() const { return impl_->assembler.skipped(); }

void Loader::start_epoch(int64_t epoch, int64_t first_batch) {
  auto plan = std::make_shared<EpochPlan>();
  plan->epoch = epoch;
  plan->order =
      shard_order(impl_->dataset_size, epoch,
                  ShardSpec{impl_->options.shuffle, impl_->options.seed, impl_->options.rank,
                            impl_->options.world_size, impl_->options.pad_shards});
  plan->num_batches = impl_->batches;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    ++impl_->generation;
    impl_->plan = std::move(plan);
    impl_->claimed = std::clamp<int64_t>(first_batch, 0, impl_->batches);
    impl_->consumed = impl_->claimed;
    for (Slot& s : impl_->slots) s = Slot{};
  }
  impl_->work_cv.notify_all();
}

std::optional<Batch> Loader::next() {
  Impl& im = *impl_;
  std::unique_lock<std::mutex> lock(im.mutex);
  if (!im.plan) throw std::logic_error("Loader::next() called before start_epoch()");
  if (im.consumed >= im.plan->num_batches) return std::nullopt;
  const int64_t b = im.consumed;
  if (im.threads.empty()) {
    ++im.consumed;
    std::shared_ptr<const EpochPlan> plan = im.plan;
    lock.unlock();
    return im.build(*plan, b, im.scratch);
  }
  Slot& slot = im.slots[static_cast<size_t>(b % im.prefetch())];
  im.ready_cv.wait(lock, [&] { return slot.ready; });
  Slot taken = std::move(slot);
  slot = Slot{};
  // A failed batch is skipped: the error surfaces once and the epoch can go on.
  ++im.consumed;
  lock.unlock();
  im.work_cv.notify_all();
  if (taken.error) std::rethrow_exception(taken.error);
  return std::move(taken.batch);
}

}  // namespace kiln::data
