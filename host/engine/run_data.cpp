#include "engine/run_data.hpp"

#include <fmt/format.h>

#include <string>

#include "engine/checks.hpp"
#include "plugin/adapters.hpp"
#include "plugin/dataset_source.hpp"

namespace kiln::engine {

namespace {

// One split of the pipeline's dataset component, opened with the run's seed.
std::shared_ptr<const data::Source> open_split(const config::Pipeline& p, int32_t split) {
  return std::make_shared<plugin::DatasetSource>(*p.dataset.component, p.dataset.options, split,
                                                 p.settings.run.seed,
                                                 p.settings.data.max_image_pixels);
}

// The data section's transform options against the data they will meet.
void check_transforms(const config::DataSettings& d, const data::Source& train) {
  for (const auto& [key, range] :
       {std::pair<const char*, const std::vector<double>*>{"data.rrc_scale", &d.rrc_scale},
        {"data.rrc_ratio", &d.rrc_ratio}}) {
    if (range->size() != 2 || !((*range)[0] <= (*range)[1])) {
      throw PipelineError(key, "expected [min, max] with min <= max");
    }
  }
  const int64_t channels = train.channels();
  for (const auto& [key, values] :
       {std::pair<const char*, const std::vector<double>*>{"data.mean", &d.mean},
        {"data.std", &d.std}}) {
    if (values->size() != 1 && static_cast<int64_t>(values->size()) != channels) {
      throw PipelineError(key, fmt::format("{} values for images of {} channels: give one value "
                                           "or one per channel",
                                           values->size(), channels));
    }
  }
}

// What multi-label data (a source of target rows) asks of the rest of the pipeline: a loss that
// takes rows, both splits of one kind, and a best checkpoint judged by a metric it has.
void check_targets(const config::Pipeline& p, const data::Source& train, const data::Source* test) {
  const bool multi = train.multi_label();
  const std::string dataset = p.settings.data.dataset;
  if (test != nullptr && test->multi_label() != multi) {
    throw PipelineError("data.dataset",
                        fmt::format("dataset '{}': the training split has {}, the validation "
                                    "split {}",
                                    dataset, multi ? "multi-label targets" : "one class per sample",
                                    multi ? "one class per sample" : "multi-label targets"));
  }
  if (test != nullptr && test->num_classes() != train.num_classes()) {
    throw PipelineError("data.dataset",
                        fmt::format("dataset '{}': the training split has {} classes, the "
                                    "validation split {}",
                                    dataset, train.num_classes(), test->num_classes()));
  }
  const std::string& best = p.settings.run.checkpoint_best;
  if (multi) {
    if (!plugin::has_model_loss(*p.model.component) && p.settings.loss.name != "bce_with_logits") {
      throw PipelineError("loss.name",
                          fmt::format("\"{}\" takes one class per sample; dataset '{}' gives "
                                      "multi-label targets: use \"bce_with_logits\"",
                                      p.settings.loss.name, dataset));
    }
    if (best == "accuracy" || best == "top5") {
      throw PipelineError("run.checkpoint_best",
                          fmt::format("\"{}\" needs one class per sample; dataset '{}' is "
                                      "multi-label: use \"map\" or \"loss\"",
                                      best, dataset));
    }
  } else if (best == "map") {
    throw PipelineError("run.checkpoint_best",
                        fmt::format("\"map\" (mean average precision) needs multi-label data; "
                                    "dataset '{}' has one class per sample",
                                    dataset));
  }
}

}  // namespace

DataSplits load_data(const config::Pipeline& p) {
  // A refusal of the dataset's create names the option it concerns (an OptionsRefused, located
  // at that key of [data] by as_config_errors); a broken dataset plugin is its own fault. The
  // validation split only when the run evaluates: a folder without one trains with eval = false.
  DataSplits splits;
  splits.train = open_split(p, KILN_SPLIT_TRAIN);
  if (p.settings.run.eval) splits.test = open_split(p, KILN_SPLIT_VAL);
  const config::DataSettings& d = p.settings.data;
  check_transforms(d, *splits.train);
  check_targets(p, *splits.train, splits.test.get());
  if (splits.test) {
    // The model takes one input size: evaluation's batches must come out as training's.
    const auto train = train_sample_shape(d, *splits.train);
    data::LoaderOptions eval = loader_options(d, 0, false, at::kCPU, 0, 1);
    eval.workers = 0;
    const auto test = data::Loader(*splits.test, eval).sample_shape();
    if (train != test) {
      throw PipelineError(
          "data.center_crop",
          fmt::format("evaluation batches would be {}x{}x{}, training batches {}x{}x{}: set "
                      "data.center_crop (and data.resize) so that evaluation gets training's "
                      "size, as torchvision's Resize + CenterCrop after RandomResizedCrop",
                      test[0], test[1], test[2], train[0], train[1], train[2]));
    }
  }
  return splits;
}

std::string describe_data(const config::Pipeline& p, const DataSplits& splits,
                          const std::array<int64_t, 3>& shape) {
  const data::Source& train = *splits.train;
  std::string text =
      fmt::format("data: '{}', training split {} samples of {} classes{}", p.settings.data.dataset,
                  train.size(), train.num_classes(), train.multi_label() ? " (multi-label)" : "");
  if (splits.test) {
    text += fmt::format(", validation split {} samples", splits.test->size());
  } else {
    text += ", no validation split (run.eval = false)";
  }
  return text + fmt::format("; samples {}x{}x{} as batched", shape[0], shape[1], shape[2]);
}

std::shared_ptr<const data::Source> open_train_split(const config::Pipeline& p) {
  return open_split(p, KILN_SPLIT_TRAIN);
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
  o.rrc_size = train ? d.random_resized_crop : 0;
  if (d.rrc_scale.size() == 2) o.rrc_scale = {d.rrc_scale[0], d.rrc_scale[1]};
  if (d.rrc_ratio.size() == 2) o.rrc_ratio = {d.rrc_ratio[0], d.rrc_ratio[1]};
  // torchvision's recipes: Resize + CenterCrop for evaluation; training uses them only in place
  // of RandomResizedCrop (images of different sizes need one or the other).
  const bool fixed_size_transforms = !train || d.random_resized_crop == 0;
  o.resize = fixed_size_transforms ? d.resize : 0;
  o.center_crop = fixed_size_transforms ? d.center_crop : 0;
  o.decode_scaled = !d.decode_full;
  o.crop_padding = train ? d.random_crop : 0;
  o.flip = train && d.random_flip;
  o.mean = d.mean;
  o.std = d.std;
  if (train) {
    o.mix.mixup_alpha = d.mixup_alpha;
    o.mix.cutmix_alpha = d.cutmix_alpha;
    o.mix.prob = d.mix_prob;
    o.mix.switch_prob = d.mix_switch_prob;
  }
  o.skip_bad_samples = d.skip_bad_samples;
  o.pin_memory = device.is_cuda();
  return o;
}

int64_t batches_per_epoch(const config::DataSettings& data, const data::Source& train,
                          int world_size) {
  data::LoaderOptions counting = loader_options(data, 0, true, at::kCPU, 0, world_size);
  counting.workers = 0;
  return data::Loader(train, counting).batches_per_epoch();
}

std::array<int64_t, 3> train_sample_shape(const config::DataSettings& data,
                                          const data::Source& train) {
  data::LoaderOptions counting = loader_options(data, 0, true, at::kCPU, 0, 1);
  counting.workers = 0;
  return data::Loader(train, counting).sample_shape();
}

}  // namespace kiln::engine
