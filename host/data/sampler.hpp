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
  bool pad = true;  // false: shards may differ by one sample (evaluation sees each sample once)
};

// Samples per rank: the dataset padded (by wrapping around) to a multiple of world_size; without
// padding, rank r holds the positions r, r + world_size, … below dataset_size.
int64_t shard_size(int64_t dataset_size, int world_size);
int64_t shard_size(int64_t dataset_size, int world_size, int rank, bool pad);

// This rank's dataset indices for `epoch`: a permutation seeded from (seed, epoch) with
// std::mt19937_64 (so torch's generator is untouched and every platform agrees), padded by
// wrapping around (unless !spec.pad), then every world_size-th entry starting at rank, as
// DistributedSampler does.
std::vector<int64_t> shard_order(int64_t dataset_size, int64_t epoch, const ShardSpec& spec);

}  // namespace kiln::data
