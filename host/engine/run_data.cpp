#include "engine/run_data.hpp"

#include "engine/checks.hpp"

namespace kiln::engine {

namespace {

std::pair<data::Dataset, data::Dataset> read_splits(const config::DataSettings& d, uint64_t seed) {
  if (d.dataset == "synthetic") {
    data::SyntheticSpec spec;
    const int64_t n_train = d.synthetic_train;
    spec.samples = n_train + d.synthetic_test;
    spec.num_classes = d.synthetic_classes;
    spec.channels = d.channels;
    spec.height = d.height;
    spec.width = d.width;
    spec.seed = seed;
    data::Dataset all = data::make_synthetic(spec);
    auto slice = [&](int64_t from, int64_t to) {
      data::Dataset part;
      part.images = all.images.slice(0, from, to).contiguous();
      part.labels = all.labels.slice(0, from, to).contiguous();
      part.num_classes = all.num_classes;
      return part;
    };
    return {slice(0, n_train), slice(n_train, spec.samples)};
  }
  const std::string root = d.root;
  return {data::load_fashion_mnist(root, "train"), data::load_fashion_mnist(root, "test")};
}

}  // namespace

std::pair<data::Dataset, data::Dataset> load_data(const config::DataSettings& d, uint64_t seed) {
  try {
    return read_splits(d, seed);
  } catch (const std::exception& e) {
    // Data that cannot be read as configured is the data section's fault.
    throw PipelineError(d.dataset == "synthetic" ? "data.dataset" : "data.root", e.what());
  }
}

data::LoaderOptions loader_options(const config::DataSettings& d, uint64_t seed, bool train,
                                   at::Device device, int rank, int world_size) {
  data::LoaderOptions o;
  o.batch_size = train ? d.batch_size / world_size : d.eval_batch_size;
  o.rank = rank;
  o.world_size = world_size;
  o.pad_shards = train;
  o.shuffle = train && d.shuffle;
  o.drop_last = train && d.drop_last;
  o.seed = seed;
  o.workers = static_cast<int>(d.workers);
  o.prefetch = static_cast<int>(d.prefetch);
  o.crop_padding = train ? d.random_crop : 0;
  o.flip = train && d.random_flip;
  o.mean = d.mean;
  o.std = d.std;
  o.pin_memory = device.is_cuda();
  return o;
}

int64_t batches_per_epoch(const config::DataSettings& data, const data::Dataset& train,
                          int world_size) {
  data::LoaderOptions counting = loader_options(data, 0, true, at::kCPU, 0, world_size);
  counting.workers = 0;
  return data::Loader(train, counting).batches_per_epoch();
}

}  // namespace kiln::engine
