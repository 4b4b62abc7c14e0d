// The order in which one rank visits a dataset during one epoch.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::data {

struct ShardSpec {
  bool shuffle = true;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
};

// Samples per rank: the dataset padded (by wrapping around) to a multiple of world_size.
int64_t shard_size(int64_t dataset_size, int world_size);

// This rank's dataset indices for `epoch`: a permutation seeded from (seed, epoch) with
// std::mt19937_64 (so torch's generator is untouched and every platform agrees), padded by
// wrapping around, then every world_size-th entry starting at rank, as DistributedSampler does.
std::vector<int64_t> shard_order(int64_t dataset_size, int64_t epoch, const ShardSpec& spec);

}  // namespace kiln::data
