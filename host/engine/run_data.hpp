// The data of a run: its train and test splits as the data section names them, and each
// rank's loader options. Shared by the run and `kiln validate`.
#pragma once

#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "config/pipeline.hpp"
#include "config/settings.hpp"
#include "data/loader.hpp"
#include "data/source.hpp"

namespace kiln::engine {

// The splits the loaders read (shared: a source may be a plugin's dataset handle).
struct DataSplits {
  std::shared_ptr<const data::Source> train, test;
};

// Train and test splits of the pipeline's dataset component (data.dataset), opened with the
// run's seed; no test split when run.eval is false. Data that cannot be opened as configured
// throws the component's refusal (plugin::OptionsRefused naming the option, e.g. data.root);
// transform options that do not fit the data (a mean per channel of another channel count,
// evaluation batches of another size than training's) a PipelineError. Both become located
// configuration errors under as_config_errors.
DataSplits load_data(const config::Pipeline& pipeline);

// What the splits hold, for `kiln validate` and a run's log: "data: 'image_folder', training
// split 8 samples of 2 classes, validation split 4 samples; samples 3x32x32 as batched";
// `shape` is the training batches' sample shape, which the caller's loader already knows.
std::string describe_data(const config::Pipeline& pipeline, const DataSplits& splits,
                          const std::array<int64_t, 3>& shape);

// The training split alone (`kiln plan`, `kiln lr-schedule`: its size and sample shape).
std::shared_ptr<const data::Source> open_train_split(const config::Pipeline& pipeline);

// This rank's loader: data.batch_size is the global batch, split evenly over the ranks; the
// training shards are padded to equal length, the evaluation shards see every sample once.
// Training takes random_resized_crop, random_crop, random_flip and mixing; evaluation resize and
// center_crop (training too without random_resized_crop).
data::LoaderOptions loader_options(const config::DataSettings& data, uint64_t seed, bool train,
                                   at::Device device, int rank, int world_size);

// Micro-batches per epoch of rank 0's training loader over `train` in a run of `world_size`
// ranks, counted without starting it.
int64_t batches_per_epoch(const config::DataSettings& data, const data::Source& train,
                          int world_size);

// {channels, height, width} of the training batches' samples: the model's input.
std::array<int64_t, 3> train_sample_shape(const config::DataSettings& data,
                                          const data::Source& train);

}  // namespace kiln::engine
