#include "config/settings.hpp"

#include "config/pipeline.hpp"

namespace kiln::config {

namespace {

RunSettings run_settings(const OptionSet& r) {
  RunSettings s;
  s.device = r.get_string("device");
  s.epochs = r.get_int("epochs");
  s.max_steps = r.get_int("max_steps");
  s.seed = static_cast<uint64_t>(r.get_int("seed"));
  s.log_interval = r.get_int("log_interval");
  s.eval = r.get_bool("eval");
  s.threads = r.get_int("threads");
  s.tf32 = r.get_string("tf32");
  s.cuda_graph = r.get_bool("cuda_graph");
  s.cudnn_benchmark = r.get_bool("cudnn_benchmark");
  s.accumulation_steps = r.get_int("accumulation_steps");
  s.grad_check_every_step = r.get_string("grad_check") == "every_step";
  s.max_nonfinite_steps = r.get_int("max_nonfinite_steps");
  s.output_dir = r.get_string("output_dir");
  s.checkpoints = r.get_bool("checkpoints");
  s.checkpoint_every = r.get_int("checkpoint_every");
  s.checkpoint_keep = r.get_int("checkpoint_keep");
  s.checkpoint_best = r.get_string("checkpoint_best");
  s.early_stop_patience = r.get_int("early_stop_patience");
  s.resume_fallback_previous = r.get_string("resume_fallback") == "previous";
  s.tensorboard = r.get_bool("tensorboard");
  s.profile_steps = r.get_int("profile_steps");
  s.profile_start = r.get_int("profile_start");
  return s;
}

DataSettings data_settings(const OptionSet& d) {
  DataSettings s;
  s.dataset = d.get_string("dataset");
  s.batch_size = d.get_int("batch_size");
  s.eval_batch_size = d.get_int("eval_batch_size");
  s.workers = d.get_int("workers");
  s.prefetch = d.get_int("prefetch");
  s.shuffle = d.get_bool("shuffle");
  s.drop_last = d.get_bool("drop_last");
  s.random_crop = d.get_int("random_crop");
  s.random_flip = d.get_bool("random_flip");
  s.random_resized_crop = d.get_int("random_resized_crop");
  s.rrc_scale = d.get_float_list("rrc_scale");
  s.rrc_ratio = d.get_float_list("rrc_ratio");
  s.resize = d.get_int("resize");
  s.center_crop = d.get_int("center_crop");
  s.decode_full = d.get_string("decode_scale") == "full";
  s.mean = d.get_float_list("mean");
  s.std = d.get_float_list("std");
  s.mixup_alpha = d.get_float("mixup_alpha");
  s.cutmix_alpha = d.get_float("cutmix_alpha");
  s.mix_prob = d.get_float("mix_prob");
  s.mix_switch_prob = d.get_float("mix_switch_prob");
  s.skip_bad_samples = d.get_string("on_error") == "skip";
  s.max_image_pixels = static_cast<uint64_t>(d.get_int("max_image_pixels"));
  return s;
}

OptimizerSettings optimizer_settings(const OptionSet& o) {
  OptimizerSettings s;
  s.lr = o.get_float("lr");
  s.weight_decay = o.get_float("weight_decay");
  s.bias_lr_mult = o.get_float("bias_lr_mult");
  s.bias_double_lr = o.get_bool("bias_double_lr");
  s.bias_decay_mult = o.get_float("bias_decay_mult");
  s.bias_weight_decay = o.get_bool("bias_weight_decay");
  s.norm_decay_mult = o.get_float("norm_decay_mult");
  s.weight_decay_norm = o.get_float("weight_decay_norm");
  s.freeze = o.get_string_list("freeze");
  s.clip_grad_norm = o.get_float("clip_grad_norm");
  s.clip_norm_type = o.get_float("clip_norm_type");
  s.clip_grad_value = o.get_float("clip_grad_value");
  return s;
}

LrPolicySettings lr_policy_settings(const OptionSet& l) {
  LrPolicySettings s;
  s.warmup = l.get_string("warmup");
  s.warmup_iters = l.get_int("warmup_iters");
  s.warmup_factor = l.get_float("warmup_factor");
  s.warmup_epochs = l.get_float("warmup_epochs");
  s.count_attempted = l.get_string("count") == "attempted";
  s.log_change_ratio = l.get_float("log_change_ratio");
  return s;
}

DistSettings dist_settings(const OptionSet& d) {
  DistSettings s;
  s.backend = d.get_string("backend");
  s.bucket_cap_mb = d.get_float("bucket_cap_mb");
  s.find_unused_parameters = d.get_bool("find_unused_parameters");
  s.broadcast_buffers = d.get_bool("broadcast_buffers");
  s.gradient_compression = d.get_string("gradient_compression");
  s.gradient_as_bucket_view = d.get_bool("gradient_as_bucket_view");
  s.sync_every_micro_step = d.get_bool("sync_every_micro_step");
  s.timeout_s = d.get_float("timeout_s");
  return s;
}

}  // namespace

Settings read_settings(const Pipeline& p) {
  Settings s;
  s.run = run_settings(p.run);
  s.data = data_settings(p.data);
  s.model.init = p.model.core.get_string("init");
  s.model.init_skip = p.model.core.get_string_list("init_skip");
  s.model.norm = p.model.core.get_string("norm");
  s.model.memory_format = p.model.core.get_string("memory_format");
  s.norm.running_stats_update = p.norm.core.get_string("running_stats_update");
  s.optimizer = optimizer_settings(p.optimizer.core);
  s.lr_policy = lr_policy_settings(p.lr_policy.core);
  s.lr_scaling.base_batch = p.lr_scaling.get_int("base_batch");
  s.dist = dist_settings(p.dist);
  s.memory.checkpoint = p.memory.get_string_list("checkpoint");
  s.loss.name = p.loss.get_string("name");
  s.loss.label_smoothing = p.loss.get_float("label_smoothing");
  s.loss.class_weights = p.loss.get_float_list("class_weights");
  s.loss.pos_weight = p.loss.get_float_list("pos_weight");
  s.ema.decay = p.ema.get_float("decay");
  s.ema.warmup = p.ema.get_bool("warmup");
  s.ema.warmup_gamma = p.ema.get_float("warmup_gamma");
  s.ema.warmup_power = p.ema.get_float("warmup_power");
  s.ema.start_step = p.ema.get_int("start_step");
  s.ema.average_buffers = p.ema.get_string("buffers") == "average";
  s.ema.evaluate = p.ema.get_bool("evaluate");
  return s;
}

}  // namespace kiln::config
