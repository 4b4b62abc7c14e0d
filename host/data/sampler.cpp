#include "data/sampler.hpp"

#include <random>
#include <utility>

namespace kiln::data {

int64_t shard_size(int64_t dataset_size, int world_size) {
  return (dataset_size + world_size - 1) / world_size;
}

int64_t shard_size(int64_t dataset_size, int world_size, int rank, bool pad) {
  if (pad) return shard_size(dataset_size, world_size);
  return dataset_size > rank ? (dataset_size - rank + world_size - 1) / world_size : 0;
}

std::vector<int64_t> shard_order(int64_t dataset_size, int64_t epoch, const ShardSpec& spec) {
  std::vector<int64_t> order(static_cast<size_t>(dataset_size));
  for (int64_t i = 0; i < dataset_size; ++i) order[i] = i;
  if (spec.shuffle) {
    const auto e = static_cast<uint64_t>(epoch);
    std::seed_seq seq{uint32_t(spec.seed), uint32_t(spec.seed >> 32), uint32_t(e),
                      uint32_t(e >> 32)};
    std::mt19937_64 gen(seq);
    // Fisher-Yates with plain modulo draws: std::shuffle's distribution is library-specific.
    for (int64_t i = dataset_size - 1; i > 0; --i) {
      std::swap(order[i], order[gen() % (static_cast<uint64_t>(i) + 1)]);
    }
  }
  const int64_t per_rank = shard_size(dataset_size, spec.world_size, spec.rank, spec.pad);
  std::vector<int64_t> shard;
  shard.reserve(static_cast<size_t>(per_rank));
  for (int64_t i = 0; i < per_rank; ++i) {
    const int64_t pos = i * spec.world_size + spec.rank;
    shard.push_back(order[pos % dataset_size]);
  }
  return shard;
}

}  // namespace kiln::data
