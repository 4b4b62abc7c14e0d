// The data of a run: its train and test splits as the data section names them, and each
// rank's loader options. Shared by the run and `kiln validate`.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <utility>

#include "config/settings.hpp"
#include "data/dataset.hpp"
#include "data/loader.hpp"

namespace kiln::engine {

// Train and test splits. Synthetic splits come from one draw (same class prototypes, disjoint
// samples), so the test split measures what the model learnt. Data that cannot be read throws
// PipelineError at data.root (data.dataset for synthetic data).
std::pair<data::Dataset, data::Dataset> load_data(const config::DataSettings& data, uint64_t seed);

// This rank's loader: data.batch_size is the global batch, split evenly over the ranks; the
// training shards are padded to equal length, the evaluation shards see every sample once.
data::LoaderOptions loader_options(const config::DataSettings& data, uint64_t seed, bool train,
                                   at::Device device, int rank, int world_size);

// Micro-batches per epoch of rank 0's training loader over `train` in a run of `world_size`
// ranks, counted without starting it.
int64_t batches_per_epoch(const config::DataSettings& data, const data::Dataset& train,
                          int world_size);

}  // namespace kiln::engine
