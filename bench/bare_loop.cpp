// bench_bare_loop — the baseline for "the cost of the plugin boundaries and the host": a plain
// C++ training loop over the ATen ops Kiln's model, norm and optimizer plugins and its host call,
// with no plugins, no configuration and no host machinery.
//
//   bench_bare_loop --case cnn|tiny --steps N --warmup W --threads T --batch B
//                   --init WEIGHTS.safetensors --data-root DIR [--hidden 64,64,...] [--width 16]
//                   [--blocks 1,1,1] [--lr 0.1 --momentum 0.9 --dampening 0 --nesterov 1
//                   --weight-decay 5e-4] [--shuffle 1 --seed 0] [--tune-heap 1]
//                   [--kiln-allocator 1] [--losses 1]
//
// Prints one JSON line: {"steps_per_s", "samples_per_s", "data_ms", "first_loss"}. A step's time
// is its whole cycle: the batch fetch, zero_grad, forward, loss, backward, the optimizer update
// and freeing the step's tensors and graph, as Kiln's time from one step's start to the next;
// steps/s = (steps - warmup) / the measured steps' summed time.
//
// - cnn: the resnet plugin at depth "small" (conv3x3 stem, BasicBlocks, conv1x1 + norm
//   shortcuts on strided blocks, global average pool, fc) with the batchnorm plugin and relu.
// - tiny: the mlp plugin (flatten, [linear + relu, one node: linear_relu.hpp] per hidden width,
//   linear head).
// Parameter and buffer names are the plugins' (conv1.weight, bn1.bias, layer2.0.downsample.1.bias,
// layers.3.linear.weight, head.bias, ...), so --init takes the file Kiln's model.init takes.
// Without --init the weights are drawn as the plugins draw them, in the plugins' order, after
// at::manual_seed(seed), as Kiln does before building the model.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/native_batch_norm.h>
#include <ATen/ops/relu.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/calling_thread.hpp"
#include "data/dataset.hpp"
#include "data/sampler.hpp"
#include "io/heap.hpp"
#include "io/memory.hpp"
#include "io/safetensors.hpp"
#include "linear_relu.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// ---- the networks ------------------------------------------------------------------------------

// A module with one tensor in and one out, so chains can hold any of them.
class Layer : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x) = 0;
};

// torch.nn's reset_parameters for conv and linear weights, as the plugins: kaiming_uniform_(a=√5).
at::Tensor default_weight(at::IntArrayRef shape) {
  at::Tensor weight = at::empty(shape);
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  return weight;
}

// k×k convolution without bias, padding k/2 (resnet's Conv2d).
class Conv : public Layer {
 public:
  Conv(int64_t in, int64_t out, int64_t kernel, int64_t stride)
      : stride_(stride), padding_(kernel / 2) {
    weight_ = register_parameter("weight", default_weight({out, in, kernel, kernel}));
  }
  at::Tensor forward(const at::Tensor& x) override {
    return at::conv2d(x, weight_, {}, {stride_, stride_}, {padding_, padding_});
  }

 private:
  at::Tensor weight_;
  int64_t stride_, padding_;
};

// y = x·Wᵀ + b; bias ~ U(±1/√fan_in), drawn after the weight (both plugins' Linear).
class Linear : public Layer {
 public:
  Linear(int64_t in, int64_t out) {
    weight_ = register_parameter("weight", default_weight({out, in}));
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    bias_ = register_parameter("bias", at::empty({out}).uniform_(-bound, bound));
  }
  at::Tensor forward(const at::Tensor& x) override { return at::linear(x, weight_, bias_); }
  at::Tensor forward_relu(const at::Tensor& x) { return kiln_mlp::linear_relu(x, weight_, bias_); }

 private:
  at::Tensor weight_, bias_;
};

// Batch normalisation (momentum 0.1, eps 1e-5, affine, running statistics) and an optional relu,
// with the tensors the host's norm layer registers: weight, bias, running_mean, running_var (no
// num_batches_tracked, which torch::nn::BatchNorm2d would add).
//
// Same forward and backward kernels as the batchnorm plugin: at::native_batch_norm, and through
// its autograd formula at::native_batch_norm_backward. Where Kiln differs: the host wraps the
// plugin in a custom autograd function (host/plugin/norm_layer.cpp) that passes DLTensor views
// across the C ABI, copies the plugin's output, statistics and gradients into tensors it
// allocated (empty_like), and makes the incoming gradient contiguous. Here autograd saves the
// input and statistics itself and nothing is copied.
class BatchNorm : public Layer {
 public:
  BatchNorm(int64_t features, bool relu) : relu_(relu) {
    weight_ = register_parameter("weight", at::ones({features}));
    bias_ = register_parameter("bias", at::zeros({features}));
    running_mean_ = register_buffer("running_mean", at::zeros({features}));
    running_var_ = register_buffer("running_var", at::ones({features}));
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor y = std::get<0>(at::native_batch_norm(x, weight_, bias_, running_mean_, running_var_,
                                                     is_training(), 0.1, 1e-5));
    // In place, as the host applies the activation the norm did not fuse: y is fresh and
    // batch norm's backward reads its input, not y.
    return relu_ ? at::relu_(y) : y;
  }

 private:
  at::Tensor weight_, bias_, running_mean_, running_var_;
  bool relu_;
};

// Blocks "0", "1", ... run in order (kiln::BlockChain without checkpointing).
class Chain : public Layer {
 public:
  void add(std::shared_ptr<Layer> block) {
    blocks_.push_back(register_module(std::to_string(blocks_.size()), std::move(block)));
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor y = x;
    for (const auto& b : blocks_) y = b->forward(y);
    return y;
  }

 private:
  std::vector<std::shared_ptr<Layer>> blocks_;
};

// conv3x3 (stride) → bn+relu → conv3x3 → bn, plus the shortcut (identity, or conv1x1 (stride) →
// bn as "downsample.0/1"), then relu.
class BasicBlock : public Layer {
 public:
  BasicBlock(int64_t in, int64_t planes, int64_t stride) {
    conv1_ = register_module("conv1", std::make_shared<Conv>(in, planes, 3, stride));
    bn1_ = register_module("bn1", std::make_shared<BatchNorm>(planes, true));
    conv2_ = register_module("conv2", std::make_shared<Conv>(planes, planes, 3, 1));
    bn2_ = register_module("bn2", std::make_shared<BatchNorm>(planes, false));
    if (stride != 1 || in != planes) {
      auto down = std::make_shared<Chain>();
      down->add(std::make_shared<Conv>(in, planes, 1, stride));
      down->add(std::make_shared<BatchNorm>(planes, false));
      downsample_ = register_module("downsample", down);
    }
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor y = bn1_->forward(conv1_->forward(x));
    y = bn2_->forward(conv2_->forward(y));
    at::Tensor sum = y + (downsample_ ? downsample_->forward(x) : x);
    return at::relu_(sum);  // the sum is fresh: in place, as the plugin
  }

 private:
  std::shared_ptr<Conv> conv1_, conv2_;
  std::shared_ptr<BatchNorm> bn1_, bn2_;
  std::shared_ptr<Chain> downsample_;
};

// resnet, depth "small": stem (conv1 3x3/1 → bn1+relu, registered on the model as the plugin and
// torchvision do) → layer1 … layerN (stage i: `blocks[i]` BasicBlocks of width·2^i,
// the first strided by 2 from stage 2 on) → global average pool → fc.
class SmallResNet : public Layer {
 public:
  SmallResNet(int64_t in_channels, int64_t width, const std::vector<int64_t>& blocks,
              int64_t classes) {
    conv1_ = register_module("conv1", std::make_shared<Conv>(in_channels, width, 3, 1));
    bn1_ = register_module("bn1", std::make_shared<BatchNorm>(width, true));
    int64_t channels = width, planes = width;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (i > 0) planes *= 2;
      auto stage = std::make_shared<Chain>();
      for (int64_t b = 0; b < blocks[i]; ++b) {
        stage->add(std::make_shared<BasicBlock>(channels, planes, i > 0 && b == 0 ? 2 : 1));
        channels = planes;
      }
      stages_.push_back(register_module("layer" + std::to_string(i + 1), stage));
    }
    fc_ = register_module("fc", std::make_shared<Linear>(channels, classes));
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor y = bn1_->forward(conv1_->forward(x));
    for (const auto& s : stages_) y = s->forward(y);
    return fc_->forward(y.mean({2, 3}));
  }

 private:
  std::shared_ptr<Conv> conv1_;
  std::shared_ptr<BatchNorm> bn1_;
  std::vector<std::shared_ptr<Chain>> stages_;
  std::shared_ptr<Linear> fc_;
};

// One mlp hidden layer: linear → relu as one autograd node, the plugin's own (linear_relu.hpp).
class Hidden : public Layer {
 public:
  Hidden(int64_t in, int64_t out) {
    linear_ = register_module("linear", std::make_shared<Linear>(in, out));
  }
  at::Tensor forward(const at::Tensor& x) override { return linear_->forward_relu(x); }

 private:
  std::shared_ptr<Linear> linear_;
};

// mlp: flatten → layers.<i> → head.
class Mlp : public Layer {
 public:
  Mlp(int64_t in_features, const std::vector<int64_t>& hidden, int64_t classes) {
    layers_ = register_module("layers", std::make_shared<Chain>());
    int64_t in = in_features;
    for (int64_t w : hidden) {
      layers_->add(std::make_shared<Hidden>(in, w));
      in = w;
    }
    head_ = register_module("head", std::make_shared<Linear>(in, classes));
  }
  at::Tensor forward(const at::Tensor& x) override {
    return head_->forward(layers_->forward(x.flatten(1)));
  }

 private:
  std::shared_ptr<Chain> layers_;
  std::shared_ptr<Linear> head_;
};

// Every parameter and buffer from `path` by name; a tensor the model lacks in the file, or one
// of another shape, is an error (as Kiln's model.init), tensors the model does not have are named
// on stderr.
void load_weights(torch::nn::Module& model, const std::string& path) {
  at::NoGradGuard no_grad;
  const kiln::io::SafetensorsFile file = kiln::io::read_safetensors(path);
  std::set<std::string> unused;
  for (const auto& item : file.tensors) unused.insert(item.first);
  std::vector<std::string> missing;
  auto load = [&](const std::string& name, at::Tensor target) {
    const at::Tensor* source = file.find(name);
    if (source == nullptr) {
      missing.push_back(name);
      return;
    }
    if (source->sizes() != target.sizes()) {
      std::ostringstream msg;
      msg << path << ": '" << name << "' has shape " << source->sizes() << ", the model's is "
          << target.sizes();
      throw std::runtime_error(msg.str());
    }
    target.copy_(*source);
    unused.erase(name);
  };
  for (const auto& item : model.named_parameters()) load(item.key(), item.value());
  for (const auto& item : model.named_buffers()) load(item.key(), item.value());
  if (!missing.empty()) {
    std::string names;
    for (const auto& n : missing) names += (names.empty() ? "" : ", ") + n;
    throw std::runtime_error(path + ": no weights for " + std::to_string(missing.size()) +
                             " of the model's tensors: " + names);
  }
  for (const auto& n : unused) std::cerr << path << ": ignored '" << n << "' (not in the model)\n";
}

// ---- the optimizer -----------------------------------------------------------------------------

// torch.optim.SGD with ATen's fused kernel, called as the sgd plugin calls it for float32
// parameters whose momentum buffer shares their dense layout (all of them here): one call for the
// tensors of at least at::internal::GRAIN_SIZE elements and one, with the OpenMP team shrunk to
// the calling thread, for the smaller ones (plugins/optimizer/common/calling_thread.hpp says
// why).
// Where Kiln differs: it calls the plugin once per parameter group (default, norm, bias; the same
// lr and weight decay unless configured otherwise), with its momentum buffers in the host's state
// store, and before that guards the step by its loss (run.grad_check = "auto"; the full
// gradient check and norm only on logged steps), which this loop does not.
struct Sgd {
  std::vector<at::Tensor> params, bufs;
  // [0]: stepped with the intra-op team, [1]: on the calling thread alone.
  std::vector<at::Tensor> split_params[2], split_bufs[2];
  double lr = 0.1, momentum = 0.9, dampening = 0.0, weight_decay = 5e-4;
  bool nesterov = true;
  bool first = true;  // the buffers start as the first gradient (torch's rule)

  void step() {
    at::NoGradGuard no_grad;
    if (first) {
      for (size_t i = 0; i < params.size(); ++i) {
        const int k = kiln::optim::steps_on_calling_thread(params[i]) ? 1 : 0;
        split_params[k].push_back(params[i]);
        if (momentum != 0.0) split_bufs[k].push_back(bufs[i]);
      }
    }
    for (int k = 0; k < 2; ++k) {
      if (split_params[k].empty()) continue;
      std::vector<at::Tensor> grads;
      grads.reserve(split_params[k].size());
      for (const auto& p : split_params[k]) grads.push_back(p.grad());
      const kiln::optim::CallingThreadOnly small(k == 1);
      at::_fused_sgd_(split_params[k], grads, at::TensorList(split_bufs[k]), weight_decay, momentum,
                      lr, dampening, nesterov, /*maximize=*/false,
                      /*is_first_step=*/first);
    }
    first = false;
  }
  // Gradients set to none, as the host's zero_grad.
  void zero_grad() {
    for (auto& p : params) p.mutable_grad() = at::Tensor();
  }
};

// ---- the data ----------------------------------------------------------------------------------

// Kiln's loader with data.workers = 0 and no augmentation, on the calling thread: the epoch's
// order from the same seeded permutation (kiln::data::shard_order, one rank), rows gathered
// into a uint8 buffer, then converted and normalised as (x/255 - mean) / std.
class Batches {
 public:
  Batches(const kiln::data::Dataset& data, int64_t batch, bool shuffle, uint64_t seed)
      : data_(data), batch_(batch), shuffle_(shuffle), seed_(seed) {}

  std::pair<at::Tensor, at::Tensor> next() {
    const int64_t n = data_.size();
    if (order_.empty() || pos_ >= n) {
      kiln::data::ShardSpec spec;
      spec.shuffle = shuffle_;
      spec.seed = seed_;
      order_ = kiln::data::shard_order(n, epoch_++, spec);
      pos_ = 0;
    }
    const int64_t count = std::min(batch_, n - pos_);
    const int64_t c = data_.images.size(1), h = data_.images.size(2), w = data_.images.size(3);
    const int64_t sample = c * h * w;
    const uint8_t* pixels = data_.images.data_ptr<uint8_t>();
    const int64_t* labels = data_.labels.data_ptr<int64_t>();
    scratch_.resize(static_cast<size_t>(count * sample));
    at::Tensor y = at::empty({count}, at::kLong);
    int64_t* out = y.data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = order_[static_cast<size_t>(pos_ + i)];
      out[i] = labels[row];
      std::memcpy(scratch_.data() + i * sample, pixels + row * sample, static_cast<size_t>(sample));
    }
    pos_ += count;
    const std::vector<int64_t> shape{count, c, h, w};
    at::Tensor x = at::empty(shape, at::kFloat);
    x.copy_(at::from_blob(scratch_.data(), shape, at::kByte));
    x.div_(255.0).sub_(kMean).div_(kStd);
    return {x, y};
  }

 private:
  static constexpr double kMean = 0.286, kStd = 0.353;  // Kiln's data.mean / data.std defaults
  const kiln::data::Dataset& data_;
  int64_t batch_;
  bool shuffle_;
  uint64_t seed_;
  int64_t epoch_ = 0, pos_ = 0;
  std::vector<int64_t> order_;
  std::vector<uint8_t> scratch_;
};

// ---- the command line --------------------------------------------------------------------------

struct Args {
  std::string case_name, init, data_root;
  int64_t steps = 0, warmup = 0, threads = 0, batch = 0, width = 16;
  std::vector<int64_t> hidden, blocks{1, 1, 1};
  double lr = 0.1, momentum = 0.9, dampening = 0.0, weight_decay = 5e-4;
  bool nesterov = true, shuffle = true, tune_heap = true, kiln_allocator = true, losses = false;
  uint64_t seed = 0;
};

[[noreturn]] void usage_error(const std::string& what) {
  throw std::invalid_argument(
      what +
      "\nusage: bench_bare_loop --case cnn|tiny --steps N --warmup W --threads T --batch B "
      "--data-root DIR [--init WEIGHTS.safetensors] [--hidden 64,64] [--width 16] "
      "[--blocks 1,1,1] [--lr 0.1] [--momentum 0.9] [--dampening 0] [--nesterov 1] "
      "[--weight-decay 5e-4] [--shuffle 1] [--seed 0] [--tune-heap 1] [--kiln-allocator 1] "
      "[--losses 0]");
}

int64_t to_int(const std::string& flag, const std::string& s) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size()) usage_error(flag + ": expected an integer, got '" + s + "'");
  return v;
}

double to_double(const std::string& flag, const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size()) usage_error(flag + ": expected a number, got '" + s + "'");
  return v;
}

bool to_bool(const std::string& flag, const std::string& s) {
  if (s == "1" || s == "true") return true;
  if (s == "0" || s == "false") return false;
  usage_error(flag + ": expected 1/0 or true/false, got '" + s + "'");
}

std::vector<int64_t> to_list(const std::string& flag, const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    const int64_t v = to_int(flag, item);
    if (v < 1) usage_error(flag + ": entries must be >= 1, got " + item);
    out.push_back(v);
  }
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  std::set<std::string> seen;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") usage_error("bench_bare_loop: a bare training loop");
    if (i + 1 >= argc) usage_error(flag + ": missing value");
    const std::string v = argv[++i];
    seen.insert(flag);
    if (flag == "--case") {
      a.case_name = v;
    } else if (flag == "--steps") {
      a.steps = to_int(flag, v);
    } else if (flag == "--warmup") {
      a.warmup = to_int(flag, v);
    } else if (flag == "--threads") {
      a.threads = to_int(flag, v);
    } else if (flag == "--batch") {
      a.batch = to_int(flag, v);
    } else if (flag == "--init") {
      a.init = v;
    } else if (flag == "--data-root") {
      a.data_root = v;
    } else if (flag == "--hidden") {
      a.hidden = to_list(flag, v);
    } else if (flag == "--width") {
      a.width = to_int(flag, v);
    } else if (flag == "--blocks") {
      a.blocks = to_list(flag, v);
    } else if (flag == "--lr") {
      a.lr = to_double(flag, v);
    } else if (flag == "--momentum") {
      a.momentum = to_double(flag, v);
    } else if (flag == "--dampening") {
      a.dampening = to_double(flag, v);
    } else if (flag == "--nesterov") {
      a.nesterov = to_bool(flag, v);
    } else if (flag == "--weight-decay") {
      a.weight_decay = to_double(flag, v);
    } else if (flag == "--shuffle") {
      a.shuffle = to_bool(flag, v);
    } else if (flag == "--seed") {
      a.seed = static_cast<uint64_t>(to_int(flag, v));
    } else if (flag == "--tune-heap") {
      a.tune_heap = to_bool(flag, v);
    } else if (flag == "--kiln-allocator") {
      a.kiln_allocator = to_bool(flag, v);
    } else if (flag == "--losses") {
      a.losses = to_bool(flag, v);
    } else {
      usage_error("unknown option " + flag);
    }
  }
  if (a.case_name != "cnn" && a.case_name != "tiny") {
    usage_error("--case must be cnn or tiny, got '" + a.case_name + "'");
  }
  for (const char* required : {"--steps", "--warmup", "--batch", "--data-root"}) {
    if (seen.count(required) == 0) usage_error(std::string(required) + " is required");
  }
  if (a.steps < 1) usage_error("--steps must be >= 1");
  if (a.warmup < 0 || a.warmup >= a.steps) usage_error("--warmup must be in [0, steps)");
  if (a.batch < 1) usage_error("--batch must be >= 1");
  if (a.threads < 0) usage_error("--threads must be >= 0 (0: torch's default)");
  if (a.width < 1) usage_error("--width must be >= 1");
  if (a.blocks.empty()) usage_error("--blocks needs at least one stage");
  if (a.case_name == "tiny" && seen.count("--hidden") == 0)
    usage_error("--case tiny needs --hidden");
  if (!(a.lr > 0.0)) usage_error("--lr must be > 0");
  if (!(a.momentum >= 0.0 && a.momentum < 1.0)) usage_error("--momentum must be in [0, 1)");
  if (!(a.dampening >= 0.0 && a.dampening <= 1.0)) usage_error("--dampening must be in [0, 1]");
  if (a.nesterov && (a.momentum <= 0.0 || a.dampening != 0.0)) {
    usage_error("--nesterov 1 needs momentum > 0 and dampening 0");
  }
  if (!(a.weight_decay >= 0.0)) usage_error("--weight-decay must be >= 0");
  return a;
}

double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

int run(const Args& a) {
  // `kiln run` keeps freed step-sized blocks in the process (host/io/heap.hpp); the baseline
  // runs under the same heap so that the comparison measures the host, not glibc's trimming.
  if (a.tune_heap) kiln::io::tune_heap_for_training();
  // Kiln's CPU tensor allocator (io/memory.hpp: counting, with freed step-sized blocks kept for
  // reuse), which `kiln run` installs at start-up, so that the ratio is the host's cost alone.
  if (a.kiln_allocator) kiln::io::count_cpu_tensor_memory();
  if (a.threads > 0) at::set_num_threads(static_cast<int>(a.threads));
  at::manual_seed(a.seed);

  const kiln::data::Dataset train = kiln::data::load_fashion_mnist(a.data_root, "train");
  std::shared_ptr<Layer> model;
  if (a.case_name == "cnn") {
    model =
        std::make_shared<SmallResNet>(train.images.size(1), a.width, a.blocks, train.num_classes);
  } else {
    model =
        std::make_shared<Mlp>(train.images.size(1) * train.images.size(2) * train.images.size(3),
                              a.hidden, train.num_classes);
  }
  if (!a.init.empty()) load_weights(*model, a.init);
  model->train();

  Sgd sgd;
  sgd.lr = a.lr;
  sgd.momentum = a.momentum;
  sgd.dampening = a.dampening;
  sgd.nesterov = a.nesterov;
  sgd.weight_decay = a.weight_decay;
  for (const auto& p : model->parameters()) {
    sgd.params.push_back(p);
    if (a.momentum != 0.0) sgd.bufs.push_back(at::zeros_like(p));
  }

  Batches batches(train, a.batch, a.shuffle, a.seed);
  double measured = 0.0, data_time = 0.0, first_loss = NAN;
  int64_t samples = 0;
  std::vector<at::Tensor> losses;
  for (int64_t step = 1; step <= a.steps; ++step) {
    const auto t0 = Clock::now();
    Clock::time_point t1;
    {
      auto [x, y] = batches.next();
      t1 = Clock::now();
      sgd.zero_grad();
      at::Tensor loss = at::cross_entropy_loss(model->forward(x), y);
      loss.backward();
      sgd.step();
      if (step == 1) first_loss = loss.item<double>();
      if (a.losses) losses.push_back(loss.detach());
      if (step > a.warmup) samples += y.size(0);
    }
    // After the scope: freeing the step's batch, loss and autograd graph is part of the cycle,
    // as it is of Kiln's step-start-to-step-start time.
    const auto t2 = Clock::now();
    if (step > a.warmup) {
      measured += seconds(t0, t2);
      data_time += seconds(t0, t1);
    }
  }
  const double n = static_cast<double>(a.steps - a.warmup);
  if (a.losses) {
    for (size_t i = 0; i < losses.size(); ++i) {
      std::fprintf(stderr, "step %zu loss %.9g\n", i + 1, losses[i].item<double>());
    }
  }
  std::printf(
      "{\"steps_per_s\": %.6g, \"samples_per_s\": %.6g, \"data_ms\": %.6g, \"first_loss\": "
      "%.9g}\n",
      n / measured, static_cast<double>(samples) / measured, 1000.0 * data_time / n, first_loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bench_bare_loop: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_bare_loop: %s\n", e.what());
    return 1;
  }
}
