#include "plugin/norm_layer.hpp"

#include <ATen/DLConvertor.h>
#include <ATen/ops/elu.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/leaky_relu.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>
#include <utility>

#include "plugin/host_api.hpp"
#include "plugin/plugin_call.hpp"
#include "plugin/status.hpp"

namespace kiln::plugin {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

DLTensor view_or_empty(const at::Tensor& t) {
  return t.defined() ? kiln::as_dltensor(t) : DLTensor{};
}

// What a handed-over gradient must look like: `like`'s shape, dtype and device, no memory.
DLTensor described(const at::Tensor& like) {
  DLTensor d = kiln::as_dltensor(like);
  d.data = nullptr;
  d.strides = nullptr;
  return d;
}

// A gradient a plugin handed over, checked against the tensor it is the gradient of.
at::Tensor adopt(const at::Tensor& handed, const at::Tensor& like, const std::string& what) {
  if (!handed.defined())
    throw ComponentError(KILN_ERR_INTERNAL, what + ": the plugin handed over no tensor");
  if (handed.sizes() != like.sizes() || handed.scalar_type() != like.scalar_type() ||
      handed.device() != like.device()) {
    throw ComponentError(KILN_ERR_INTERNAL, what + ": handed over " + handed.toString() + " " +
                                                c10::str(handed.sizes()) + ", expected " +
                                                like.toString() + " " + c10::str(like.sizes()));
  }
  return handed;
}

// The batch statistics a norm plugin reported in a training forward (ABI 1.5), which the host
// needs when it moves the running statistics itself.
void check_report(const kiln_norm_batch_stats& report, const std::string& plugin) {
  if (report.reported == 0) {
    throw ComponentError(KILN_ERR_INTERNAL,
                         "norm '" + plugin +
                             "' forward: reported no batch statistics "
                             "(kiln_norm_forward_args.batch_stats, ABI 1.5), which "
                             "norm.running_stats_update needs under accumulation");
  }
  if (report.reserved != 0) {  // ABI 1.6: a later minor may give the field a meaning
    throw ComponentError(KILN_ERR_INTERNAL, "norm '" + plugin +
                                                "' forward: kiln_norm_batch_stats field "
                                                "'reserved' is " +
                                                std::to_string(report.reserved) + ", not zero");
  }
}

// kiln_norm_setup.device_type (ABI 1.9): DLPack's code for the run's device, 0 (unknown) for a
// device the ABI does not name for norm plugins.
int32_t dl_device_type(c10::DeviceType device) {
  switch (device) {
    case c10::kCPU:
      return kDLCPU;
    case c10::kCUDA:
      return kDLCUDA;
    default:
      return 0;
  }
}

// x → plugin forward → y; backward → plugin backward. weight/bias are inputs so autograd routes
// their gradients to the module's parameters.
struct NormFunction : public torch::autograd::Function<NormFunction> {
  // Without affine, `weight_in` and `bias_in` are placeholders (see PluginNormLayer::forward).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight_in, const at::Tensor& bias_in,
                            PluginNormLayer* layer) {
    const bool affine = layer->layout().affine != 0;
    const at::Tensor weight = affine ? weight_in : at::Tensor();
    const at::Tensor bias = affine ? bias_in : at::Tensor();
    const int64_t channels = input.size(1);
    auto stat_options = input.options().dtype(at::kFloat);
    // An in-place layer writes over its input: the model's own tensor when the model allowed
    // it (autograd is told through mark_dirty), else a copy, so the model's tensor stays intact.
    const bool in_place = layer->layout().in_place != 0;
    const bool overwrite = in_place && layer->may_overwrite_input();
    at::Tensor output = in_place ? (overwrite ? input : input.clone()) : at::empty_like(input);
    at::Tensor save_mean = at::empty({channels}, stat_options);
    at::Tensor save_invstd = at::empty({channels}, stat_options);
    const bool training = layer->is_training();

    DLTensor x = kiln::as_dltensor(in_place ? output : input), y = kiln::as_dltensor(output);
    DLTensor w = view_or_empty(weight), b = view_or_empty(bias);
    DLTensor rm = view_or_empty(layer->running_mean), rv = view_or_empty(layer->running_var);
    DLTensor sm = kiln::as_dltensor(save_mean), si = kiln::as_dltensor(save_invstd);
    kiln_norm_forward_args args{};
    args.struct_size = sizeof(args);
    args.training = training ? 1 : 0;
    args.input = &x;
    args.output = &y;
    args.weight = weight.defined() ? &w : nullptr;
    args.bias = bias.defined() ? &b : nullptr;
    args.running_mean = layer->running_mean.defined() ? &rm : nullptr;
    args.running_var = layer->running_var.defined() ? &rv : nullptr;
    args.save_mean = &sm;
    args.save_invstd = &si;
    args.stream = host_api()->current_stream(x.device);
    // Under accumulation the host may update the running statistics itself: the plugin then
    // gets none and reports the batch's (ABI 1.5).
    NormWindow* window = training ? layer->reporting_window() : nullptr;
    BatchStats batch;
    DLTensor bm, bv;
    kiln_norm_batch_stats report{};
    if (window != nullptr) {
      batch.mean = at::empty({channels}, stat_options);
      batch.var = at::empty({channels}, stat_options);
      bm = kiln::as_dltensor(batch.mean);
      bv = kiln::as_dltensor(batch.var);
      report.struct_size = sizeof(report);
      report.mean = &bm;
      report.var = &bv;
      args.running_mean = nullptr;
      args.running_var = nullptr;
      args.batch_stats = &report;
    }
    // What the plugin keeps for its backward (ABI 1.11), owned here from the moment it returns.
    DLManagedTensor* reserve_out = nullptr;
    args.reserve_result = &reserve_out;
    kiln_call_context call;
    call.group = layer->group();  // synced norm layers reduce over the run's ranks
    kiln_status* status =
        call_plugin([&] { return layer->where("forward"); },
                    [&] { return layer->vtable()->forward(layer->instance(), &call, &args); });
    const at::Tensor reserve = reserve_out != nullptr ? at::fromDLPack(reserve_out) : at::Tensor();
    if (status != nullptr) {
      check(status, "norm '" + layer->plugin_name() + "' forward");  // the context only on errors
    }
    if (window != nullptr) {
      check_report(report, layer->plugin_name());
      batch.count = report.count;
      batch.momentum = report.momentum;
      window->record(layer, layer->running_mean, layer->running_var, std::move(batch));
    }

    const int32_t saves = layer->layout().saves;
    at::Tensor kept = saves == KILN_NORM_SAVE_OUTPUT    ? output
                      : saves == KILN_NORM_SAVE_NOTHING ? at::Tensor()
                                                        : input;
    // The output beside the input (ABI 1.12): what an activation's own backward would have kept.
    at::Tensor kept_output = saves == KILN_NORM_SAVE_INPUT_AND_OUTPUT ? output : at::Tensor();
    if (overwrite) ctx->mark_dirty({input});
    ctx->save_for_backward({kept, weight, bias, save_mean, save_invstd, reserve, kept_output});
    ctx->saved_data["layer"] = reinterpret_cast<int64_t>(layer);
    ctx->saved_data["training"] = training;
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* layer = reinterpret_cast<PluginNormLayer*>(ctx->saved_data["layer"].toInt());
    const bool training = ctx->saved_data["training"].toBool();
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor& kept = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& bias = saved[2];
    // Plugins index the gradient as they indexed the input: give them a dense one, in the
    // layout autograd gave it (NCHW, or NHWC under channels_last: no transposing copy).
    at::Tensor grad_output = grad_outputs[0].contiguous(grad_outputs[0].suggest_memory_format());
    const bool frozen = layer->layout().frozen != 0;
    const bool want_weight = !frozen && weight.defined() && ctx->needs_input_grad(1);
    const bool want_bias = !frozen && bias.defined() && ctx->needs_input_grad(2);
    // A plugin that hands over its own gradients gets descriptions (data NULL), not buffers.
    const bool hand_over = layer->layout().hands_over_gradients != 0;
    at::Tensor grad_input, grad_weight, grad_bias;
    if (!hand_over) {
      grad_input = at::empty_like(grad_output);
      if (want_weight) grad_weight = at::empty_like(weight);
      if (want_bias) grad_bias = at::empty_like(bias);
    }
    auto slot = [&](const at::Tensor& buffer, const at::Tensor& like) {
      return hand_over ? described(like) : kiln::as_dltensor(buffer);
    };

    DLTensor go = kiln::as_dltensor(grad_output);
    DLTensor s = kept.defined() ? kiln::as_dltensor(kept) : DLTensor{};
    DLTensor w = view_or_empty(weight), b = view_or_empty(bias);
    DLTensor rm = view_or_empty(layer->running_mean), rv = view_or_empty(layer->running_var);
    DLTensor sm = kiln::as_dltensor(saved[3]), si = kiln::as_dltensor(saved[4]);
    const at::Tensor& reserve = saved[5];
    DLTensor r = reserve.defined() ? kiln::as_dltensor(reserve) : DLTensor{};
    const at::Tensor& kept_output = saved[6];
    DLTensor so = kept_output.defined() ? kiln::as_dltensor(kept_output) : DLTensor{};
    DLTensor gi = slot(grad_input, grad_output);
    DLTensor gw = want_weight ? slot(grad_weight, weight) : DLTensor{};
    DLTensor gb = want_bias ? slot(grad_bias, bias) : DLTensor{};
    DLManagedTensor* results[3] = {nullptr, nullptr, nullptr};
    kiln_norm_backward_args args{};
    args.struct_size = sizeof(args);
    args.training = training ? 1 : 0;
    args.grad_output = &go;
    args.saved = kept.defined() ? &s : nullptr;
    args.weight = weight.defined() ? &w : nullptr;
    args.bias = bias.defined() ? &b : nullptr;
    args.running_mean = layer->running_mean.defined() ? &rm : nullptr;
    args.running_var = layer->running_var.defined() ? &rv : nullptr;
    args.save_mean = &sm;
    args.save_invstd = &si;
    args.grad_input = &gi;
    args.grad_weight = want_weight ? &gw : nullptr;
    args.grad_bias = want_bias ? &gb : nullptr;
    args.stream = host_api()->current_stream(go.device);
    args.reserve = reserve.defined() ? &r : nullptr;
    args.saved_output = kept_output.defined() ? &so : nullptr;
    if (hand_over) {
      args.grad_input_result = &results[0];
      args.grad_weight_result = want_weight ? &results[1] : nullptr;
      args.grad_bias_result = want_bias ? &results[2] : nullptr;
    }
    kiln_call_context call;
    call.group = layer->group();  // synced norm layers reduce over the run's ranks
    kiln_status* status =
        call_plugin([&] { return layer->where("backward"); },
                    [&] { return layer->vtable()->backward(layer->instance(), &call, &args); });
    if (hand_over) {
      // Owned first, so that every handed-over tensor is released whatever is refused below.
      at::Tensor owned[3];
      for (int i = 0; i < 3; ++i) {
        if (results[i] != nullptr) owned[i] = at::fromDLPack(results[i]);
      }
      const std::string name = "norm '" + layer->plugin_name() + "' backward";
      check(status, name);
      grad_input = adopt(owned[0], grad_output, name + " grad_input");
      if (want_weight) grad_weight = adopt(owned[1], weight, name + " grad_weight");
      if (want_bias) grad_bias = adopt(owned[2], bias, name + " grad_bias");
    } else if (status != nullptr) {
      check(status, "norm '" + layer->plugin_name() + "' backward");
    }
    return {grad_input, grad_weight, grad_bias, at::Tensor()};
  }
};

}  // namespace

PluginNormLayer::PluginNormLayer(const Component& component, const config::OptionSet& options,
                                 const kiln_norm_request& request, int32_t world_size,
                                 std::shared_ptr<NormWindow> window, dist::ProcessGroup* group,
                                 c10::DeviceType device)
    : name_(component.name()),
      library_(component.library_path),
      vtable_(static_cast<const kiln_norm_vtable*>(component.descriptor->vtable)),
      activation_(request.activation),
      activation_param_(request.activation_param),
      may_overwrite_input_(KILN_HAS_FIELD(&request, kiln_norm_request, may_overwrite_input) &&
                           request.may_overwrite_input != 0),
      group_(group) {
  kiln_norm_setup setup{};
  setup.struct_size = sizeof(setup);
  setup.num_features = request.num_features;
  setup.activation = request.activation;
  setup.activation_param = request.activation_param;
  setup.world_size = world_size;
  setup.device_type = dl_device_type(device);
  layout_.struct_size = sizeof(layout_);
  check_options(call_plugin([&] { return where("create"); },
                            [&] {
                              return vtable_->create(host_api(), options.c_view(), &setup, &layout_,
                                                     &instance_);
                            }),
                "norm '" + name_ + "' refused a layer of " + std::to_string(request.num_features) +
                    " features",
                "norm");
  refuse_unknown_saves();
  const int64_t c = request.num_features;
  if (layout_.affine && layout_.frozen) {
    // Fixed affine (FrozenBatchNorm): kept and checkpointed, never handed to an optimizer.
    weight_ = register_buffer("weight", at::ones({c}));
    bias_ = register_buffer("bias", at::zeros({c}));
  } else if (layout_.affine) {
    weight_ = register_parameter("weight", at::ones({c}));
    bias_ = register_parameter("bias", at::zeros({c}));
  } else {
    no_affine_ = at::empty({0});
  }
  if (layout_.running_stats) {
    running_mean = register_buffer("running_mean", at::zeros({c}));
    running_var = register_buffer("running_var", at::ones({c}));
  }
  // Only a layer whose running statistics move in training has an update to hand over.
  const bool moves_stats = layout_.running_stats != 0 && layout_.frozen == 0;
  if (window != nullptr && window->mode() != RunningStatsUpdate::kMicroBatch && moves_stats) {
    if (component.plugin->abi_minor < 5) {
      release_instance();  // no destructor runs for a constructor that throws
      const std::string reason =
          "norm '" + name_ + "' is built for Kiln ABI 1." +
          std::to_string(component.plugin->abi_minor) +
          " and cannot report its batch statistics (ABI 1.5), which running_stats_update needs "
          "under accumulation; rebuild it, or use \"micro_batch\"";
      throw OptionsRefused(KILN_ERR_UNSUPPORTED, reason, "norm", reason);
    }
    window_ = std::move(window);
  }
}

void PluginNormLayer::refuse_unknown_saves() {
  const int32_t saves = layout_.saves;
  std::string reason;
  if (saves < 0 || saves > KILN_NORM_SAVE_INPUT_AND_OUTPUT) {
    reason = "asks the host to save " + std::to_string(saves) +
             " for its backward, which is no KILN_NORM_SAVE_* value (kiln/norm.h)";
  } else if (saves == KILN_NORM_SAVE_INPUT_AND_OUTPUT && layout_.in_place != 0) {
    reason = "asks the host to save its input and its output, but writes the output over the input";
  }
  if (reason.empty()) return;
  release_instance();  // no destructor runs for a constructor that throws
  throw ComponentError(KILN_ERR_INTERNAL, "norm '" + name_ + "' (" + library_ + ") " + reason);
}

NormWindow* PluginNormLayer::reporting_window() const {
  return window_ != nullptr && window_->host_updates() ? window_.get() : nullptr;
}

PluginNormLayer::~PluginNormLayer() { release_instance(); }

void PluginNormLayer::release_instance() {
  if (instance_ == nullptr) return;
  call_plugin_noexcept([&] { return where("destroy"); }, [&] { vtable_->destroy(instance_); });
  instance_ = nullptr;
}

std::string PluginNormLayer::where(const char* entry) const {
  return "norm '" + name_ + "' " + entry + " (" + library_ + ")";
}

at::Tensor PluginNormLayer::forward(const at::Tensor& input) {
  // Module::to() moves parameters and buffers with set_data, so these handles stay current.
  // torch's C++ autograd functions take defined tensors only: a layer without affine passes a
  // placeholder, which the function reads as absent.
  at::Tensor y = weight_.defined() ? NormFunction::apply(input, weight_, bias_, this)
                                   : NormFunction::apply(input, no_affine_, no_affine_, this);
  if (layout_.fused_activation) return y;
  switch (activation_) {
    case KILN_ACT_RELU:
      return at::relu_(y);
    case KILN_ACT_LEAKY_RELU:
      return at::leaky_relu_(y, activation_param_);
    case KILN_ACT_ELU:
      return at::elu_(y, activation_param_);
    default:
      return y;
  }
}

}  // namespace kiln::plugin
