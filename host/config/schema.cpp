// The host's own keys of each pipeline section, as option specs (the shape plugins use), so one
// validator and one doc generator serve both.
#include <limits>
#include <map>
#include <stdexcept>

#include "config/pipeline.hpp"

namespace kiln::config {

namespace {

constexpr double kNoBound = std::numeric_limits<double>::quiet_NaN();

// A spec; NaN bounds mean "unbounded". A `min` of kPositive (the smallest positive double)
// expresses "> 0" with the inclusive bounds of the ABI.
kiln_option_spec spec(const char* name, int32_t type, const char* default_value, const char* doc,
                      double min = kNoBound, double max = kNoBound, const char* choices = nullptr) {
  kiln_option_spec s{};
  s.struct_size = sizeof(kiln_option_spec);
  s.name = name;
  s.type = type;
  s.has_min = min == min ? 1 : 0;
  s.has_max = max == max ? 1 : 0;
  s.min = s.has_min ? min : 0.0;
  s.max = s.has_max ? max : 0.0;
  s.default_value = default_value;
  s.choices = choices;
  s.doc = doc;
  return s;
}

kiln_option_spec choice(const char* name, const char* choices, const char* default_value,
                        const char* doc) {
  return spec(name, KILN_OPT_STRING, default_value, doc, kNoBound, kNoBound, choices);
}

constexpr double kPositive = std::numeric_limits<double>::denorm_min();

const std::map<std::string, std::vector<kiln_option_spec>>& schemas() {
  static const std::map<std::string, std::vector<kiln_option_spec>> all = {
      {"run",
       {
           choice("device", "auto,cpu,cuda", "\"auto\"",
                  "where to train: auto picks cuda when available"),
           spec("epochs", KILN_OPT_INT, "1", "passes over the training set", 1),
           spec("max_steps", KILN_OPT_INT, "0",
                "stop after this many optimizer steps; 0 = no limit", 0),
           spec("seed", KILN_OPT_INT, "0", "seed for initialisation, shuffling and augmentation",
                0),
           spec("log_interval", KILN_OPT_INT, "50", "optimizer steps between progress lines", 1),
           spec("eval", KILN_OPT_BOOL, "true", "evaluate on the test set after each epoch"),
           spec("threads", KILN_OPT_INT, "0", "CPU threads for torch; 0 = torch's default", 0),
           choice("tf32", "default,on,off", "\"default\"",
                  "TensorFloat-32 on CUDA for fp32 work: default = PyTorch's (cuDNN convolutions "
                  "on, cuBLAS matmuls off), on = both, off = neither"),
           spec("cuda_graph", KILN_OPT_BOOL, "false",
                "capture a step's forward, loss, backward and gradient check as a CUDA graph "
                "after 3 eager steps and replay it (static batch shapes; one process, no "
                "accumulation, no float32 master weights, no activation checkpointing: else the "
                "run says why and stays eager); clipping and the optimizer are in the graph too "
                "when the optimizer declares itself capturable (`kiln plugins` lists it as "
                "capturable), else they run after each replay"),
           spec("cudnn_benchmark", KILN_OPT_BOOL, "true",
                "let cuDNN time its convolution algorithms on the first batch of each shape and "
                "keep the fastest (torch.backends.cudnn.benchmark); false for runs whose shapes "
                "keep changing"),
           spec("accumulation_steps", KILN_OPT_INT, "1",
                "micro-batches per optimizer step (gradient accumulation); the last window of an "
                "epoch may be shorter and is averaged over its own length",
                1),
           choice("grad_check", "auto,every_step", "\"auto\"",
                  "the pass over every gradient that checks for inf/NaN and measures grad_norm: "
                  "every_step, or auto = every step where loss scaling, clipping, a half "
                  "precision model or data parallelism needs it, else on logged steps only, with "
                  "the step guarded by its loss (a non-finite loss skips it)"),
           spec("max_nonfinite_steps", KILN_OPT_INT, "5",
                "without dynamic loss scaling: stop after this many consecutive steps with "
                "non-finite gradients or loss (each is skipped); the run diverged",
                1),
           spec("output_dir", KILN_OPT_STRING, "\"\"",
                "folder of the run folders (version_N/, one per run) that hold what a run saves "
                "(checkpoints/, tensorboard/, weights when a guard stops it); empty = "
                "runs/<pipeline file name>"),
           spec("checkpoints", KILN_OPT_BOOL, "true",
                "write checkpoints to <output_dir>/version_N/checkpoints (and one at the end of "
                "the run)"),
           spec("checkpoint_every", KILN_OPT_INT, "0",
                "optimizer steps between checkpoints; 0 = at the end of every epoch", 0),
           spec("checkpoint_keep", KILN_OPT_INT, "3", "newest checkpoints kept", 1),
           choice("checkpoint_best", "none,accuracy,top5,map,loss", "\"none\"",
                  "after each evaluation, keep the checkpoint with the best value so far "
                  "(highest accuracy, top5 or map, lowest loss) as checkpoints/best, besides the "
                  "checkpoint_keep newest (mmengine save_best, Lightning monitor); map (mean "
                  "average precision) for multi-label data, accuracy and top5 for the rest"),
           spec("early_stop_patience", KILN_OPT_INT, "0",
                "stop the run once this many evaluations in a row have not beaten the best of "
                "checkpoint_best's metric (Lightning EarlyStopping patience); 0 = never",
                0),
           choice("resume_fallback", "previous,stop", "\"previous\"",
                  "--resume auto and the newest checkpoint is corrupt, truncated or from another "
                  "config: refuse it and use the previous one, or stop"),
           spec("tensorboard", KILN_OPT_BOOL, "true",
                "write TensorBoard event files to <output_dir>/version_N/tensorboard"),
           spec("profile_steps", KILN_OPT_INT, "0",
                "optimizer steps to trace with torch's profiler (Kineto: the host's ATen ops and, "
                "on CUDA, the kernels and copies), saved by rank 0 as a Chrome trace in "
                "<output_dir>/version_N/profile/steps_<first>-<last>.json; 0 = off",
                0),
           spec("profile_start", KILN_OPT_INT, "5",
                "the first optimizer step traced by profile_steps (the first steps warm up "
                "allocators and cuDNN's algorithm search)",
                1),
       }},
      {"data",
       {
           spec("dataset", KILN_OPT_STRING, "\"fashion-mnist\"",
                "dataset component to train on (image_folder, cifar10, cifar100, tensors, idx, "
                "fashion-mnist, synthetic, or a plugin's); its own options (root, ...) go in "
                "this section too"),
           spec("batch_size", KILN_OPT_INT, "128",
                "training batch size, global: a distributed run gives each rank batch_size / "
                "world size",
                1),
           spec("eval_batch_size", KILN_OPT_INT, "1000", "evaluation batch size (per rank)", 1),
           spec("workers", KILN_OPT_INT, "2", "background threads preparing batches", 0, 64),
           spec("prefetch", KILN_OPT_INT, "4", "batches prepared ahead of the trainer", 1, 1024),
           spec("shuffle", KILN_OPT_BOOL, "true", "reshuffle the training set every epoch"),
           spec("drop_last", KILN_OPT_BOOL, "false", "drop the last incomplete training batch"),
           spec("random_crop", KILN_OPT_INT, "0",
                "zero-padding pixels for random-crop augmentation; 0 = off", 0, 16),
           spec("random_flip", KILN_OPT_BOOL, "false",
                "random horizontal flips of training images"),
           spec("random_resized_crop", KILN_OPT_INT, "0",
                "training: torchvision RandomResizedCrop to this square size (a crop of a random "
                "area fraction in rrc_scale and aspect ratio in rrc_ratio, resized bilinear with "
                "antialiasing); 0 = off",
                0, 8192),
           spec("rrc_scale", KILN_OPT_FLOAT_LIST, "[0.08, 1.0]",
                "random_resized_crop: [min, max] fraction of the image's area", kPositive, 1),
           spec("rrc_ratio", KILN_OPT_FLOAT_LIST, "[0.75, 1.3333333333333333]",
                "random_resized_crop: [min, max] aspect ratio (width / height), drawn "
                "log-uniformly",
                kPositive),
           spec("resize", KILN_OPT_INT, "0",
                "torchvision Resize: the shorter side becomes this (bilinear with antialiasing), "
                "for evaluation, and for training when random_resized_crop is off; 0 = off",
                0, 8192),
           spec("center_crop", KILN_OPT_INT, "0",
                "torchvision CenterCrop to this square size after resize (evaluation, and "
                "training when random_resized_crop is off); 0 = off",
                0, 8192),
           choice("decode_scale", "auto,full", "\"auto\"",
                  "auto = ask the dataset to decode at 1/2, 1/4 or 1/8 scale (JPEG's DCT "
                  "scaling) where the crop or resize keeps at least the output's pixels: faster, "
                  "and close to but not exactly torchvision's pixels; full = always decode at "
                  "full scale (torchvision's pixels)"),
           spec("mean", KILN_OPT_FLOAT_LIST, "[0.286]",
                "normalisation mean subtracted from pixels in [0, 1]: one value for every "
                "channel, or one per channel (e.g. [0.485, 0.456, 0.406])"),
           spec("std", KILN_OPT_FLOAT_LIST, "[0.353]",
                "normalisation standard deviation: one value, or one per channel", kPositive),
           spec("mixup_alpha", KILN_OPT_FLOAT, "0.0",
                "mixup (timm Mixup, mode batch): lambda ~ Beta(alpha, alpha), each sample mixed "
                "with the batch's reverse, soft targets; 0 = off",
                0),
           spec("cutmix_alpha", KILN_OPT_FLOAT, "0.0",
                "cutmix (timm): lambda ~ Beta(alpha, alpha), a box of the reversed batch pasted, "
                "lambda corrected to the box's area; 0 = off",
                0),
           spec("mix_prob", KILN_OPT_FLOAT, "1.0",
                "chance that a training batch is mixed when mixup or cutmix is on", 0, 1),
           spec("mix_switch_prob", KILN_OPT_FLOAT, "0.5",
                "with mixup and cutmix both on: chance of cutmix for a mixed batch", 0, 1),
           choice("on_error", "stop,skip", "\"stop\"",
                  "a sample that cannot be read: stop with its path, or skip = replace it by "
                  "the next sample (the same replacement on every run), log its path once and "
                  "count it"),
           spec("max_image_pixels", KILN_OPT_INT, "89478485",
                "decompression-bomb limit, PIL's Image.MAX_IMAGE_PIXELS: an image whose header "
                "claims more pixels (height x width) is decoded with a warning, one of more "
                "than twice as many is refused before anything is allocated (a sample that "
                "cannot be read, for on_error); the same for every size a dataset reports; "
                "0 = no limit",
                0),
       }},
      {"model",
       {spec("name", KILN_OPT_STRING, nullptr, "model component to train"),
        spec(
            "init", KILN_OPT_STRING, "\"\"",
            "safetensors file of starting weights by parameter name (from Python or kiln "
            "export, or a torchvision/timm state_dict saved with safetensors); empty = the model's "
            "own initialisation"),
        spec("init_skip", KILN_OPT_STRING_LIST, "[]",
             "regular expressions (ECMAScript, searched in the name, as optimizer.freeze): "
             "model tensors that match keep the model's own initialisation instead of "
             "model.init's, e.g. [\"^fc\\\\.\"] for a new head (docs/finetune.md)"),
        spec("norm", KILN_OPT_STRING, "\"\"",
             "norm component behind every norm layer of the model, e.g. \"syncbn\" "
             "(convert_sync_batchnorm as one key); wins over norm.name; its options stay in "
             "[norm]; empty = norm.name"),
        choice("memory_format", "auto,contiguous,channels_last", "\"auto\"",
               "layout of the model's 4-D weights and input batches: channels_last (NHWC) feeds "
               "oneDNN's convolutions on the cpu and cuDNN's tensor-core ones under "
               "float16/bfloat16; auto = channels_last for a convolutional model on the cpu and "
               "on cuda with a half precision, contiguous elsewhere, except that on an AVX-512 "
               "cpu in float32 the convolutions on maps of at most 16 pixels with at least 256 "
               "input channels keep NCHW weights (oneDNN's blocked kernels are faster there; "
               "docs/speed.md); contiguous = NCHW, as a PyTorch model by default")}},
      {"norm",
       {spec("name", KILN_OPT_STRING, "\"batchnorm\"", "normalisation layer component"),
        choice("running_stats_update", "micro_batch,adjusted_momentum,pooled_window",
               "\"micro_batch\"",
               "how running statistics move with run.accumulation_steps = k > 1: micro_batch = "
               "every micro-batch at the norm's momentum m (PyTorch); adjusted_momentum = every "
               "micro-batch at 1 - (1 - m)^(1/k), so a step decays them by 1 - m as without "
               "accumulation; pooled_window = once per step at m, with the mean and unbiased "
               "variance of all the window's samples (ranks and micro-batches pooled)")}},
      // [optimizer.inner]: the optimizer a wrapper (KILN_CAP_WRAPS_OPTIMIZER) steps; its own
      // options follow `name`.
      {"optimizer.inner",
       {spec("name", KILN_OPT_STRING, nullptr,
             "the inner optimizer component (any optimizer that steps one group at a time)")}},
      // [[optimizer.partition]]: parameters handed to another optimizer; its options follow.
      {"optimizer.partition",
       {spec("name", KILN_OPT_STRING, nullptr,
             "the optimizer component that steps the parameters this entry selects"),
        spec("min_rank", KILN_OPT_INT, "0",
             "selects parameters of at least this many dimensions (2: matrices and up)", 0),
        spec("max_rank", KILN_OPT_INT, "-1",
             "selects parameters of at most this many dimensions; -1 = no bound", -1),
        spec("match", KILN_OPT_STRING, "\"\"",
             "regular expression (ECMAScript, searched in the parameter name) a selected "
             "parameter must match; \"\" = any"),
        spec("exclude", KILN_OPT_STRING, "\"\"",
             "regular expression a selected parameter must not match; \"\" = none"),
        spec("groups", KILN_OPT_STRING_LIST, "[]",
             "parameter groups (default, bias, norm, custom_keys[\"<pattern>\"]) a selected "
             "parameter must belong to; [] = any"),
        spec("lr_mult", KILN_OPT_FLOAT, "1.0",
             "lr multiplier of the selected parameters, on top of their group's", 0),
        spec("decay_mult", KILN_OPT_FLOAT, "1.0",
             "weight-decay multiplier of the selected parameters, on top of their group's", 0)}},
      {"optimizer",
       {
           spec("name", KILN_OPT_STRING, "\"sgd\"", "optimizer component"),
           spec("lr", KILN_OPT_FLOAT, "0.1", "base learning rate", kPositive),
           spec("weight_decay", KILN_OPT_FLOAT, "0.0", "L2 weight decay", 0),
           spec("bias_lr_mult", KILN_OPT_FLOAT, "1.0",
                "lr multiplier of biases outside norm layers (mmengine bias_lr_mult)", 0),
           spec("bias_double_lr", KILN_OPT_BOOL, "false",
                "Pet BIAS_DOUBLE_LR: biases outside norm layers train at 2x lr"),
           spec("bias_decay_mult", KILN_OPT_FLOAT, "1.0",
                "weight-decay multiplier of biases outside norm layers (mmengine)", 0),
           spec("bias_weight_decay", KILN_OPT_BOOL, "true",
                "Pet BIAS_WEIGHT_DECAY: false = no weight decay on biases outside norm layers"),
           spec("norm_decay_mult", KILN_OPT_FLOAT, "1.0",
                "weight-decay multiplier of norm-layer weights and biases (mmengine)", 0),
           spec("weight_decay_norm", KILN_OPT_FLOAT, "nan",
                "Pet WEIGHT_DECAY_NORM: weight decay of norm-layer parameters; nan = "
                "weight_decay x norm_decay_mult"),
           spec("freeze", KILN_OPT_STRING_LIST, "[]",
                "regular expressions; matching parameters are frozen and left out"),
           spec("clip_grad_norm", KILN_OPT_FLOAT, "0.0",
                "clip gradients to this global norm after unscaling (torch clip_grad_norm_); "
                "0 = off",
                0),
           spec("clip_norm_type", KILN_OPT_FLOAT, "2.0",
                "p of the global gradient norm (inf for the max norm); also the norm logged as "
                "grad_norm",
                1, std::numeric_limits<double>::infinity()),
           spec("clip_grad_value", KILN_OPT_FLOAT, "0.0",
                "clamp every gradient element to [-v, v] after unscaling (torch "
                "clip_grad_value_); 0 = off",
                0),
       }},
      {"lr_policy",
       {
           spec("name", KILN_OPT_STRING, "\"constant\"", "learning-rate schedule component"),
           choice("warmup", "none,constant,linear,torch_linear", "\"none\"",
                  "warm-up replacing the policy for iterations 1..W: constant = lr x factor "
                  "(Pet CONSTANT, torch ConstantLR); linear = Pet LINEAR, lr x (factor + (1 - "
                  "factor) x it / W), the base lr at W; torch_linear = torch LinearLR(factor, "
                  "total_iters = W), lr x (factor + (1 - factor) x (it - 1) / W)"),
           spec("warmup_iters", KILN_OPT_INT, "0", "optimizer steps of warmup (W)", 0),
           spec("warmup_factor", KILN_OPT_FLOAT, "0.1", "learning-rate factor at warmup start", 0,
                1),
           spec("warmup_epochs", KILN_OPT_FLOAT, "0.0",
                "warmup length in epochs: W = round(warmup_epochs x optimizer steps per epoch), "
                "halves away from zero; excludes warmup_iters",
                0),
           choice("count", "applied,attempted", "\"applied\"",
                  "steps the schedule counts: applied (skipped overflow steps do not advance it) "
                  "or attempted (PyTorch's behaviour)"),
           spec("log_change_ratio", KILN_OPT_FLOAT, "1.1",
                "log a line when one step changes the lr by more than this ratio after one that "
                "did not (a milestone; a run of such steps, as a cosine's tail, logs its first), "
                "besides the first step's lr and the end of warm-up; 0 = never",
                0),
       }},
      {"lr_scaling",
       {
           spec("base_batch", KILN_OPT_INT, "0",
                "linear scaling: lr x effective batch / base_batch, effective batch = batch_size "
                "(global) x accumulation steps = world size x per-rank batch x accumulation steps; "
                "0 = off",
                0),
       }},
      {"precision", {spec("name", KILN_OPT_STRING, "\"fp32\"", "precision policy component")}},
      {"dist",
       {
           choice("backend", "auto,gloo,nccl", "\"auto\"",
                  "c10d backend of a distributed run: auto = nccl on cuda, gloo on cpu"),
           spec("bucket_cap_mb", KILN_OPT_FLOAT, "25.0",
                "gradient bucket size in MiB (DDP bucket_cap_mb); each bucket is all-reduced "
                "during backward as soon as it is full",
                kPositive),
           spec("find_unused_parameters", KILN_OPT_BOOL, "false",
                "walk the autograd graph each step for parameters that got no gradient (DDP "
                "find_unused_parameters); needed only by models that skip parameters"),
           spec("broadcast_buffers", KILN_OPT_BOOL, "true",
                "give every rank rank 0's buffers (BN running statistics) at the start of each "
                "optimizer step"),
           choice("gradient_compression", "none,fp16,bf16", "\"none\"",
                  "all-reduce gradients as 16-bit values (DDP fp16/bf16 compress hooks)"),
           spec("gradient_as_bucket_view", KILN_OPT_BOOL, "true",
                "gradients alias the all-reduce buckets, saving a gradient-sized copy and a pass "
                "over the gradients each step (false: DDP's default, separate gradients)"),
           spec("sync_every_micro_step", KILN_OPT_BOOL, "false",
                "with accumulation: all-reduce on every micro-step (DDP without no_sync) instead "
                "of only the last of each window"),
           spec("timeout_s", KILN_OPT_FLOAT, "300.0",
                "seconds a rank waits in a collective (or at start-up) for the others before "
                "failing; a rank that died or hung is then named",
                kPositive),
       }},
      {"memory",
       {spec("checkpoint", KILN_OPT_STRING_LIST, "[\"none\"]",
             "activation checkpointing: \"none\", \"sqrt\" (sqrt(n) segments over the model's "
             "blocks) or a list of block or chain names (kiln plan lists them); checkpointed "
             "segments keep only their input and recompute the rest in backward")}},
      {"loss",
       {
           choice("name", "cross_entropy,bce_with_logits", "\"cross_entropy\"",
                  "training and evaluation loss: cross_entropy = F.cross_entropy (labels, or "
                  "mixup/cutmix's soft targets as probabilities); bce_with_logits = "
                  "F.binary_cross_entropy_with_logits against one-hot targets (timm "
                  "BinaryCrossEntropy), averaged over samples and classes"),
           spec("label_smoothing", KILN_OPT_FLOAT, "0.0",
                "cross_entropy: F.cross_entropy's label_smoothing (targets become (1 - s) x "
                "target + s / classes); bce_with_logits: the same on the one-hot or soft targets "
                "(timm's off = s / classes, on = 1 - s + off)",
                0, 1),
           spec("class_weights", KILN_OPT_FLOAT_LIST, "[]",
                "one weight per class (as many as the dataset has classes): cross_entropy's "
                "weight (a batch's mean is over the weights of its labels, as torch's); "
                "bce_with_logits' weight, per class; [] = none",
                0),
           spec("pos_weight", KILN_OPT_FLOAT_LIST, "[]",
                "bce_with_logits: weight of the positive term, one per class (torch's "
                "pos_weight); [] = none",
                0),
       }},
      {"ema",
       {
           spec("decay", KILN_OPT_FLOAT, "0.0",
                "an exponential moving average of the model's weights (timm ModelEmaV3), updated "
                "after every optimizer step: ema = decay x ema + (1 - decay) x weights, from "
                "the fp32 master weights where the model is half; below 1, 0 = off (timm's "
                "default decay is 0.9998)",
                0, 1),
           spec("warmup", KILN_OPT_BOOL, "false",
                "timm's use_warmup: the decay at step t is min(decay, 1 - (1 + t / "
                "warmup_gamma)^-warmup_power), so that the average forgets its start early"),
           spec("warmup_gamma", KILN_OPT_FLOAT, "1.0", "warmup: timm's warmup_gamma", kPositive),
           spec("warmup_power", KILN_OPT_FLOAT, "0.6666666666666666",
                "warmup: timm's warmup_power (2/3; 3/4 for a short run)", kPositive),
           spec("start_step", KILN_OPT_INT, "0",
                "timm's update_after_step: the average is a copy of the weights up to step "
                "start_step + 1 and averages from the next",
                0),
           choice("buffers", "average,copy", "\"average\"",
                  "the model's floating buffers (BN running statistics): averaged as the "
                  "weights (timm's default) or copied (timm's exclude_buffers); integer buffers "
                  "are copied"),
           spec("evaluate", KILN_OPT_BOOL, "true",
                "evaluations (run.eval, kiln evaluate, checkpoint_best, early stopping) measure "
                "the averaged weights, as timm's train.py does with --model-ema; false: the "
                "trained ones"),
       }},
      {"plugins",
       {spec("paths", KILN_OPT_STRING_LIST, "[]", "extra folders to search for plugin libraries")}},
  };
  return all;
}

}  // namespace

const std::vector<kiln_option_spec>& core_schema(const std::string& section) {
  const auto& all = schemas();
  const auto it = all.find(section);
  if (it == all.end()) throw std::out_of_range("no core section '" + section + "'");
  return it->second;
}

const std::vector<std::string>& core_sections() {
  static const std::vector<std::string> sections = {
      "run",       "data", "model",  "norm", "optimizer", "lr_policy", "lr_scaling",
      "precision", "dist", "memory", "loss", "ema",       "plugins"};
  return sections;
}

}  // namespace kiln::config
