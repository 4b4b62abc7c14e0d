// A model that computes its own loss (the model vtable's loss slot, ABI 1.8): `mse_linear`, a
// linear classifier over flattened images (parameters fc.weight, fc.bias) whose loss is the mean
// squared error between the logits and the one-hot labels (soft targets as they are), averaged
// over N x C: something cross-entropy is not, so a run shows which loss trained.
// Built twice: as a 1.8 plugin (tests/plugins/loss_model/), and with OLD_VTABLE as a 1.7 plugin
// lays its vtable out (tests/plugins/loss_model_v1_7/): descriptor and probe say 1.7, struct_size
// ends before the slot, and the memory after it holds a function that aborts, which the host
// must never call (it trains with its own [loss] then).
#include <ATen/ops/one_hot.h>
#include <torch/nn/modules/linear.h>

#include <cstdlib>

#include "kiln/torch.hpp"

namespace {

using kiln::Error;

const kiln_host_api* g_host = nullptr;  // from create: statuses of the loss slot

class MseLinear : public kiln::Model {
 public:
  MseLinear(int64_t in, int64_t classes)
      : fc_(register_module("fc", torch::nn::Linear(in, classes))) {}
  at::Tensor forward(const at::Tensor& x) override { return fc_->forward(x.flatten(1)); }

 private:
  torch::nn::Linear fc_;
};

kiln_status* create(const kiln_host_api* host, const kiln_options* /*options*/,
                    const kiln_model_input* input, kiln_torch_module** out) {
  g_host = host;
  return KILN_GUARD(host, {
    if (input == nullptr || out == nullptr) {
      throw Error(KILN_ERR_INVALID_ARGUMENT, "mse_linear: create needs an input and an out");
    }
    *out = kiln::release_model(std::make_shared<MseLinear>(
        input->channels * input->height * input->width, input->num_classes));
  });
}

kiln_status* loss(kiln_torch_module* /*model*/, const kiln_model_loss_args* args) {
  return KILN_GUARD(g_host, {
    if (args == nullptr || !KILN_HAS_FIELD(args, kiln_model_loss_args, loss)) {
      throw Error(KILN_ERR_INVALID_ARGUMENT, "mse_linear: loss args too small");
    }
    const at::Tensor& output = kiln::tensor_of(args->output);
    const at::Tensor& target = kiln::tensor_of(args->target);
    const at::Tensor x = output.to(at::kFloat);
    const at::Tensor p = at::isFloatingType(target.scalar_type())
                             ? target.to(at::kFloat)
                             : at::one_hot(target, x.size(1)).to(at::kFloat);
    kiln::set_tensor(args->loss, (x - p).pow(2).mean());
  });
}

#ifdef OLD_VTABLE
[[maybe_unused]] const auto kUnused = &loss;  // the 1.7 build has no slot for it
kiln_status* never_called(kiln_torch_module*, const kiln_model_loss_args*) { std::abort(); }
// A 1.7 vtable's size, and after it what happens to lie in memory.
const kiln_model_vtable kVtableStorage = {KILN_MODEL_VTABLE_V1_SIZE, &create,
                                          &kiln::destroy_model_handle, &never_called};
const kiln_model_vtable* const kVtable = &kVtableStorage;
constexpr uint32_t kMinor = 7;
#else
const kiln_model_vtable kVtableStorage =
    KILN_MODEL_VTABLE_LOSS_INIT(&create, &kiln::destroy_model_handle, &loss);
const kiln_model_vtable* const kVtable = &kVtableStorage;
constexpr uint32_t kMinor = KILN_ABI_MINOR;
#endif

const kiln_capabilities kCapabilities =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32 |
                           KILN_CAP_DTYPE_F16 | KILN_CAP_DTYPE_BF16);
const kiln_component_descriptor kComponent = KILN_COMPONENT_INIT(
    KILN_COMPONENT_MODEL, "mse_linear", KILN_VERSION_INIT(1, 0, 0),
    "linear classifier with its own loss: MSE to one-hot targets", &kCapabilities, kVtable);
const kiln_component_descriptor* const kComponents[] = {&kComponent};

kiln_plugin_descriptor make_descriptor() {
  kiln_plugin_descriptor d =
      KILN_PLUGIN_DESCRIPTOR_INIT("loss-model", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);
  d.abi_minor = kMinor;
  return d;
}
const kiln_plugin_descriptor kDescriptor = make_descriptor();

}  // namespace

KILN_EXTERN_C KILN_EXPORT uint32_t kiln_plugin_abi(void) {
  return KILN_ABI_PACK(KILN_ABI_MAJOR, kMinor);
}

KILN_EXTERN_C KILN_EXPORT const kiln_plugin_descriptor* kiln_plugin_get(void) {
  return &kDescriptor;
}
