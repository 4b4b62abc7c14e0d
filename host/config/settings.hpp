// The host's own keys of a pipeline, typed: read once from the validated tables when the
// pipeline loads (config/schema.cpp lists them), so the engine reads fields and a misspelt key
// fails the first load of any pipeline instead of the line that first reads it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::config {

struct Pipeline;

struct RunSettings {
  std::string device;  // auto, cpu, cuda
  int64_t epochs = 1;
  int64_t max_steps = 0;  // 0: no limit
  uint64_t seed = 0;
  int64_t log_interval = 50;
  bool eval = true;
  int64_t threads = 0;  // 0: torch's default
  std::string tf32;     // default, on, off
  bool cuda_graph = false;
  bool cudnn_benchmark = true;
  int64_t accumulation_steps = 1;
  bool grad_check_every_step = false;  // grad_check = "every_step" (else "auto")
  int64_t max_nonfinite_steps = 5;
  std::string output_dir;  // empty: runs/<pipeline file name>
  bool checkpoints = true;
  int64_t checkpoint_every = 0;  // 0: at each epoch's end
  int64_t checkpoint_keep = 3;
  std::string checkpoint_best = "none";  // none, accuracy, top5, map, loss
  int64_t early_stop_patience = 0;       // 0: off
  bool resume_fallback_previous = true;  // resume_fallback = "previous" (else "stop")
  bool tensorboard = true;
  int64_t profile_steps = 0;  // 0: no trace
  int64_t profile_start = 5;
};

struct DataSettings {
  std::string dataset;       // the dataset component's name; its options: Pipeline::dataset
  int64_t batch_size = 128;  // global
  int64_t eval_batch_size = 1000;
  int64_t workers = 2;
  int64_t prefetch = 4;
  bool shuffle = true;
  bool drop_last = false;
  int64_t random_crop = 0;
  bool random_flip = false;
  int64_t random_resized_crop = 0;  // 0: off
  std::vector<double> rrc_scale{0.08, 1.0};
  std::vector<double> rrc_ratio{0.75, 4.0 / 3.0};
  int64_t resize = 0;                            // 0: off
  int64_t center_crop = 0;                       // 0: off
  bool decode_full = false;                      // decode_scale = "full" (else "auto")
  std::vector<double> mean{0.0}, std{1.0};       // one value, or one per channel
  double mixup_alpha = 0.0, cutmix_alpha = 0.0;  // 0: off
  double mix_prob = 1.0, mix_switch_prob = 0.5;
  bool skip_bad_samples = false;  // on_error = "skip" (else "stop")
  // Decompression-bomb limit, PIL's Image.MAX_IMAGE_PIXELS (data::kDefaultMaxImagePixels); 0: none.
  uint64_t max_image_pixels = 89478485;
};

struct ModelSettings {
  std::string init;                    // safetensors file of starting weights; empty: none
  std::vector<std::string> init_skip;  // regexes: tensors left at the model's initialisation
  std::string norm;                    // norm component wired into the model; empty: norm.name
  std::string memory_format;           // auto, contiguous, channels_last
};

struct NormSettings {
  std::string running_stats_update;  // micro_batch, adjusted_momentum, pooled_window
};

struct OptimizerSettings {
  double lr = 0.1;
  double weight_decay = 0.0;
  double bias_lr_mult = 1.0;
  bool bias_double_lr = false;
  double bias_decay_mult = 1.0;
  bool bias_weight_decay = true;
  double norm_decay_mult = 1.0;
  double weight_decay_norm = 0.0;  // NaN: weight_decay x norm_decay_mult
  std::vector<std::string> freeze;
  double clip_grad_norm = 0.0;  // 0: off
  double clip_norm_type = 2.0;
  double clip_grad_value = 0.0;  // 0: off
};

struct LrPolicySettings {
  std::string warmup;  // none, constant, linear, torch_linear
  int64_t warmup_iters = 0;
  double warmup_factor = 0.1;
  double warmup_epochs = 0.0;
  bool count_attempted = false;  // count = "attempted" (else "applied")
  double log_change_ratio = 1.1;
};

struct LrScalingSettings {
  int64_t base_batch = 0;  // 0: off
};

struct DistSettings {
  std::string backend;  // auto, gloo, nccl
  double bucket_cap_mb = 25.0;
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;
  std::string gradient_compression;  // none, fp16, bf16
  bool gradient_as_bucket_view = true;
  bool sync_every_micro_step = false;
  double timeout_s = 300.0;
};

struct MemorySettings {
  std::vector<std::string> checkpoint;  // activation checkpointing: none, sqrt or block names
};

struct LossSettings {
  std::string name = "cross_entropy";  // cross_entropy, bce_with_logits
  double label_smoothing = 0.0;
  std::vector<double> class_weights;  // empty: none
  std::vector<double> pos_weight;     // bce_with_logits; empty: none
};

// [ema]: timm ModelEmaV3's settings.
struct EmaSettings {
  double decay = 0.0;  // 0: off
  bool warmup = false;
  double warmup_gamma = 1.0;
  double warmup_power = 2.0 / 3.0;
  int64_t start_step = 0;
  bool average_buffers = true;  // buffers = "average" (else "copy")
  bool evaluate = true;
};

struct Settings {
  RunSettings run;
  DataSettings data;
  ModelSettings model;
  NormSettings norm;
  OptimizerSettings optimizer;
  LrPolicySettings lr_policy;
  LrScalingSettings lr_scaling;
  DistSettings dist;
  MemorySettings memory;
  LossSettings loss;
  EmaSettings ema;
};

// Reads every host key of `pipeline`'s tables (validated, defaults filled). Throws
// std::out_of_range naming a key the schema does not have: a host bug the first load shows.
Settings read_settings(const Pipeline& pipeline);

}  // namespace kiln::config
