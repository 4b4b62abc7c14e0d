// small_cnn: a model plugin in C++ over LibTorch, built out of tree against the installed SDK.
// A stem (conv3x3 -> norm+relu), `depth` blocks of the same at `width` channels, global average
// pooling and a linear head. Its norm layers come from the host (kiln::make_norm_layer), so the
// pipeline's [norm] (batchnorm, syncbn, frozen_bn, ...) applies; its blocks sit in a
// kiln::BlockChain, so memory.checkpoint can recompute them. Parameter names: stem.conv.weight,
// stem.norm.*, blocks.<i>.conv.weight, blocks.<i>.norm.*, head.weight, head.bias.
#include <ATen/ops/conv2d.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/nn/init.h>

#include <cmath>
#include <memory>

#include "kiln/torch.hpp"

namespace {

using kiln::Error;

// A 3x3 convolution without bias (the norm layer after it has one), initialised like
// torch.nn.Conv2d: kaiming_uniform_(a=sqrt(5)).
class Conv3x3 : public torch::nn::Module {
 public:
  Conv3x3(int64_t in, int64_t out) {
    at::Tensor weight = at::empty({out, in, 3, 3});
    torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
    weight_ = register_parameter("weight", weight);
  }
  at::Tensor forward(const at::Tensor& x) { return at::conv2d(x, weight_, {}, 1, 1); }

 private:
  at::Tensor weight_;
};

// conv3x3 -> the pipeline's norm layer, which applies the relu itself (a fusing norm plugin
// does both in one pass).
class ConvNormRelu : public torch::nn::Module {
 public:
  ConvNormRelu(const kiln::NormSource& norms, int64_t in, int64_t out) {
    conv_ = register_module("conv", std::make_shared<Conv3x3>(in, out));
    norm_ = register_module("norm", kiln::make_norm_layer(norms, out, KILN_ACT_RELU));
  }
  at::Tensor forward(const at::Tensor& x) { return norm_->forward(conv_->forward(x)); }

 private:
  std::shared_ptr<Conv3x3> conv_;
  std::shared_ptr<kiln::NormLayer> norm_;
};

// y = x W^T + b, initialised like torch.nn.Linear: weight and bias ~ U(+-1/sqrt(fan_in)).
class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in, int64_t out) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    weight_ = register_parameter("weight", at::empty({out, in}).uniform_(-bound, bound));
    bias_ = register_parameter("bias", at::empty({out}).uniform_(-bound, bound));
  }
  at::Tensor forward(const at::Tensor& x) { return at::linear(x, weight_, bias_); }

 private:
  at::Tensor weight_;
  at::Tensor bias_;
};

// The model: what the host trains. Children are registered under the names above; the host
// reads named_parameters() for the optimizer, checkpoints and freeze patterns.
class SmallCnn : public kiln::Model {
 public:
  SmallCnn(const kiln::NormSource& norms, const kiln_model_input& input, int64_t width,
           int64_t depth) {
    stem_ = register_module("stem", std::make_shared<ConvNormRelu>(norms, input.channels, width));
    blocks_ = register_module("blocks", std::make_shared<kiln::BlockChain>());
    for (int64_t i = 0; i < depth; ++i) {
      blocks_->add(std::make_shared<ConvNormRelu>(norms, width, width));
    }
    head_ = register_module("head", std::make_shared<Linear>(width, input.num_classes));
  }

  at::Tensor forward(const at::Tensor& images) override {
    at::Tensor x = blocks_->forward(stem_->forward(images));
    return head_->forward(x.mean({2, 3}));  // global average pooling
  }

 private:
  std::shared_ptr<ConvNormRelu> stem_;
  std::shared_ptr<kiln::BlockChain> blocks_;
  std::shared_ptr<Linear> head_;
};

const kiln_option_spec options[] = {
    KILN_OPTION_RANGE_INIT("width", KILN_OPT_INT, 1.0, 1024.0, "16", "channels of every conv"),
    KILN_OPTION_RANGE_INIT("depth", KILN_OPT_INT, 0.0, 64.0, "2", "blocks after the stem"),
};

int64_t int_option(const kiln_options* opts, const char* name, int64_t fallback) {
  const kiln_option_value* v = kiln::find_option(opts, name, KILN_OPT_INT, "small_cnn");
  return v != nullptr ? v->int_value : fallback;
}

kiln_status* create(const kiln_host_api* host, const kiln_options* opts,
                    const kiln_model_input* input, kiln_torch_module** out) {
  // No C++ exception may cross the C ABI: KILN_GUARD turns one into a status.
  return KILN_GUARD(host, {
    if (input == nullptr || out == nullptr) {
      throw Error(KILN_ERR_INVALID_ARGUMENT, "small_cnn: create needs an input and an out");
    }
    *out = nullptr;
    if (input->channels < 1 || input->num_classes < 1) {
      throw Error(KILN_ERR_INVALID_ARGUMENT, "small_cnn: no channels or no classes");
    }
    auto model =
        std::make_shared<SmallCnn>(kiln::NormSource(host, input), *input,
                                   int_option(opts, "width", 16), int_option(opts, "depth", 2));
    *out = kiln::release_model(std::move(model));
  });
}

const kiln_capabilities caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32 |
                           KILN_CAP_DTYPE_F16 | KILN_CAP_DTYPE_BF16);

const kiln_model_vtable vtable = KILN_MODEL_VTABLE_INIT(&create, &kiln::destroy_model_handle);

const kiln_component_descriptor component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_MODEL, "small_cnn", KILN_VERSION_INIT(1, 0, 0),
    "a small CNN: conv + pipeline norm blocks", &caps, options, &vtable);

const kiln_component_descriptor* const components[] = {&component};

const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("small-cnn", KILN_VERSION_INIT(1, 0, 0), components, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C KILN_EXPORT const kiln_plugin_descriptor* kiln_plugin_get(void) {
  return &descriptor;
}
