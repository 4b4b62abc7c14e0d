#include "cudnn_relu.hpp"

#include <ATen/cudnn/Handle.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <cudnn.h>
#include <dlfcn.h>

#include <cstdint>
#include <limits>
#include <string>

#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace kiln::norm::cudnn {

namespace {

// cuDNN's persistent NHWC kernels, the ones ATen's cudnn_batch_norm takes for channels-last data.
constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
constexpr cudnnBatchNormOps_t kOps = CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
// The dtype of this route's reserve (the plain route's is ATen's uint8).
constexpr at::ScalarType kReserveType = at::kChar;

// The cuDNN functions this route calls, looked up in the libcudnn that libtorch_cuda (which this
// plugin links) has loaded: the plugin then needs no path to the library, which only torch's wheel
// knows (nvidia/cudnn/lib), and takes the very copy ATen's handle belongs to.
struct Api {
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnCreateTensorDescriptor) create_tensor = nullptr;
  decltype(&cudnnDestroyTensorDescriptor) destroy_tensor = nullptr;
  decltype(&cudnnSetTensor4dDescriptor) set_tensor = nullptr;
  decltype(&cudnnDeriveBNTensorDescriptor) derive_channel = nullptr;
  decltype(&cudnnCreateActivationDescriptor) create_activation = nullptr;
  decltype(&cudnnDestroyActivationDescriptor) destroy_activation = nullptr;
  decltype(&cudnnSetActivationDescriptor) set_activation = nullptr;
  decltype(&cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize) forward_workspace = nullptr;
  decltype(&cudnnGetBatchNormalizationTrainingExReserveSpaceSize) reserve_size = nullptr;
  decltype(&cudnnGetBatchNormalizationBackwardExWorkspaceSize) backward_workspace = nullptr;
  decltype(&cudnnBatchNormalizationForwardTrainingEx) forward = nullptr;
  decltype(&cudnnBatchNormalizationBackwardEx) backward = nullptr;

  bool complete() const {
    return error_string != nullptr && create_tensor != nullptr && destroy_tensor != nullptr &&
           set_tensor != nullptr && derive_channel != nullptr && create_activation != nullptr &&
           destroy_activation != nullptr && set_activation != nullptr &&
           forward_workspace != nullptr && reserve_size != nullptr &&
           backward_workspace != nullptr && forward != nullptr && backward != nullptr;
  }
};

template <typename F>
void bind(void* library, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(library, name));
}

// The table, or nullptr where libcudnn is not loaded (a torch built without it).
const Api* api() {
  static const Api table = [] {
    Api a;
    const std::string soname = "libcudnn.so." + std::to_string(CUDNN_MAJOR);
    void* library = dlopen(soname.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (library == nullptr) return a;
    bind(library, a.error_string, "cudnnGetErrorString");
    bind(library, a.create_tensor, "cudnnCreateTensorDescriptor");
    bind(library, a.destroy_tensor, "cudnnDestroyTensorDescriptor");
    bind(library, a.set_tensor, "cudnnSetTensor4dDescriptor");
    bind(library, a.derive_channel, "cudnnDeriveBNTensorDescriptor");
    bind(library, a.create_activation, "cudnnCreateActivationDescriptor");
    bind(library, a.destroy_activation, "cudnnDestroyActivationDescriptor");
    bind(library, a.set_activation, "cudnnSetActivationDescriptor");
    bind(library, a.forward_workspace, "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize");
    bind(library, a.reserve_size, "cudnnGetBatchNormalizationTrainingExReserveSpaceSize");
    bind(library, a.backward_workspace, "cudnnGetBatchNormalizationBackwardExWorkspaceSize");
    bind(library, a.forward, "cudnnBatchNormalizationForwardTrainingEx");
    bind(library, a.backward, "cudnnBatchNormalizationBackwardEx");
    return a;
  }();
  return table.complete() ? &table : nullptr;
}

void check(const Api& api, cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS) {
    throw kiln::Error(KILN_ERR_INTERNAL, std::string("batchnorm: cuDNN's ") + call +
                                             " failed: " + api.error_string(status));
  }
}

// A cuDNN descriptor made by `create` and released by `destroy` when it goes.
template <typename Handle>
class Owned {
 public:
  using Create = cudnnStatus_t (*)(Handle*);
  using Destroy = cudnnStatus_t (*)(Handle);
  Owned(const Api& api, Create create, Destroy destroy, const char* call) : destroy_(destroy) {
    check(api, create(&handle_), call);
  }
  ~Owned() { destroy_(handle_); }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Handle get() const { return handle_; }

 private:
  Destroy destroy_;
  Handle handle_ = nullptr;
};

// One call's descriptors: the data (x, y and their gradients: N x C x H x W half, NHWC), the
// per-channel tensors derived from it (weight, bias, statistics: float), and the ReLU. Each member
// releases its own, so a constructor that fails half-way leaks nothing.
struct Descriptors {
  Descriptors(const Api& api, const at::Tensor& x)
      : data(api, api.create_tensor, api.destroy_tensor, "cudnnCreateTensorDescriptor"),
        channel(api, api.create_tensor, api.destroy_tensor, "cudnnCreateTensorDescriptor"),
        relu(api, api.create_activation, api.destroy_activation,
             "cudnnCreateActivationDescriptor") {
    const auto dim = [&](int64_t i) { return static_cast<int>(x.size(i)); };
    check(api,
          api.set_tensor(data.get(), CUDNN_TENSOR_NHWC, CUDNN_DATA_HALF, dim(0), dim(1), dim(2),
                         dim(3)),
          "cudnnSetTensor4dDescriptor");
    check(api, api.derive_channel(channel.get(), data.get(), kMode),
          "cudnnDeriveBNTensorDescriptor");
    check(api, api.set_activation(relu.get(), CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0),
          "cudnnSetActivationDescriptor");
  }
  Owned<cudnnTensorDescriptor_t> data, channel;
  Owned<cudnnActivationDescriptor_t> relu;
};

// A [C] float32 tensor on x's device, as cuDNN reads and writes the per-channel values.
bool per_channel(const at::Tensor& t, const at::Tensor& x) {
  return t.defined() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
         t.numel() == x.size(1) && t.device() == x.device();
}

// Where cuDNN's fused kernel takes the data: half, 4-d, dense channels-last (its NHWC), channels
// a multiple of 4 (its vector width), sizes within int, the output in the input's layout.
bool fits(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weight,
          const at::Tensor& bias) {
  return x.is_cuda() && x.scalar_type() == at::kHalf && x.dim() == 4 && x.numel() > 0 &&
         x.numel() <= std::numeric_limits<int>::max() && x.size(1) % 4 == 0 &&
         x.is_contiguous(at::MemoryFormat::ChannelsLast) && y.scalar_type() == at::kHalf &&
         y.sizes() == x.sizes() && y.strides() == x.strides() && per_channel(weight, x) &&
         per_channel(bias, x);
}

at::Tensor bytes(size_t n, const at::Tensor& like, at::ScalarType type) {
  return at::empty({static_cast<int64_t>(n)}, like.options().dtype(type));
}

}  // namespace

bool fuses_relu(const kiln_host_api* host, const kiln_norm_setup* setup, bool enabled) {
  return enabled && host->abi_minor >= 12 && setup->activation == KILN_ACT_RELU &&
         KILN_HAS_FIELD(setup, kiln_norm_setup, device_type) && setup->device_type == kDLCUDA &&
         api() != nullptr;
}

bool relu_forward(const kiln_norm_forward_args* args, const at::Tensor& x, const at::Tensor& output,
                  const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& running_mean,
                  const at::Tensor& running_var, double momentum, double eps) {
  if (!KILN_HAS_FIELD(args, kiln_norm_forward_args, reserve_result) ||
      args->reserve_result == nullptr || args->save_mean == nullptr ||
      args->save_invstd == nullptr || !fits(x, output, weight, bias) ||
      running_mean.defined() != running_var.defined() ||
      (running_mean.defined() && (!per_channel(running_mean, x) || !per_channel(running_var, x)))) {
    return false;
  }
  at::Tensor save_mean = kiln::as_tensor(*args->save_mean);
  at::Tensor save_invstd = kiln::as_tensor(*args->save_invstd);
  const Api* a = api();
  if (a == nullptr || !per_channel(save_mean, x) || !per_channel(save_invstd, x)) return false;
  cudnnHandle_t handle = at::native::getCudnnHandle();  // on the current stream
  const Descriptors d(*a, x);
  size_t workspace_size = 0, reserve_size = 0;
  // cuDNN says here whether its fused kernel takes these sizes; nothing is written before.
  if (a->forward_workspace(handle, kMode, kOps, d.data.get(), nullptr, d.data.get(),
                           d.channel.get(), d.relu.get(),
                           &workspace_size) != CUDNN_STATUS_SUCCESS ||
      a->reserve_size(handle, kMode, kOps, d.relu.get(), d.data.get(), &reserve_size) !=
          CUDNN_STATUS_SUCCESS) {
    return false;
  }
  at::Tensor workspace = bytes(workspace_size, x, at::kByte);
  at::Tensor reserve = bytes(reserve_size, x, kReserveType);
  const float one = 1.0F, zero = 0.0F;
  check(*a,
        a->forward(handle, kMode, kOps, &one, &zero, d.data.get(), x.const_data_ptr(), nullptr,
                   nullptr, d.data.get(), output.data_ptr(), d.channel.get(),
                   weight.const_data_ptr(), bias.const_data_ptr(), momentum,
                   running_mean.defined() ? running_mean.data_ptr() : nullptr,
                   running_var.defined() ? running_var.data_ptr() : nullptr, eps,
                   save_mean.data_ptr(), save_invstd.data_ptr(), d.relu.get(), workspace.data_ptr(),
                   workspace_size, reserve.data_ptr(), reserve_size),
        "cudnnBatchNormalizationForwardTrainingEx");
  kiln::hand_over(args->reserve_result, reserve);
  return true;
}

bool relu_backward(const kiln_norm_backward_args* args, const at::Tensor& x,
                   const at::Tensor& grad_output, double eps,
                   std::tuple<at::Tensor, at::Tensor, at::Tensor>& grads) {
  if (!KILN_HAS_FIELD(args, kiln_norm_backward_args, saved_output) || args->reserve == nullptr ||
      !x.is_cuda()) {
    return false;
  }
  at::Tensor reserve = kiln::as_tensor(*args->reserve);
  if (reserve.scalar_type() != kReserveType) return false;
  // From here on the forward ran this route: anything missing is the host's or the plugin's bug.
  const Api* a = api();
  const at::Tensor weight = args->weight != nullptr ? kiln::as_tensor(*args->weight) : at::Tensor();
  const at::Tensor bias = args->bias != nullptr ? kiln::as_tensor(*args->bias) : at::Tensor();
  const at::Tensor y =
      args->saved_output != nullptr ? kiln::as_tensor(*args->saved_output) : at::Tensor();
  if (a == nullptr || !y.defined() || !fits(x, y, weight, bias) || args->save_mean == nullptr ||
      args->save_invstd == nullptr) {
    throw kiln::Error(KILN_ERR_INTERNAL,
                      "batchnorm: the backward of cuDNN's batch norm + ReLU lacks its forward's "
                      "input, output or statistics");
  }
  const at::Tensor dy = grad_output.contiguous(at::MemoryFormat::ChannelsLast);
  cudnnHandle_t handle = at::native::getCudnnHandle();
  const Descriptors d(*a, x);
  size_t workspace_size = 0;
  check(
      *a,
      a->backward_workspace(handle, kMode, kOps, d.data.get(), d.data.get(), d.data.get(), nullptr,
                            d.data.get(), d.channel.get(), d.relu.get(), &workspace_size),
      "cudnnGetBatchNormalizationBackwardExWorkspaceSize");
  at::Tensor workspace = bytes(workspace_size, x, at::kByte);
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  at::Tensor dw = at::empty_like(weight), db = at::empty_like(bias);
  const float one = 1.0F, zero = 0.0F;
  check(*a,
        a->backward(handle, kMode, kOps, &one, &zero, &one, &zero, d.data.get(), x.const_data_ptr(),
                    d.data.get(), y.const_data_ptr(), d.data.get(), dy.const_data_ptr(), nullptr,
                    nullptr, d.data.get(), dx.data_ptr(), d.channel.get(), weight.const_data_ptr(),
                    bias.const_data_ptr(), dw.data_ptr(), db.data_ptr(), eps,
                    kiln::as_tensor(*args->save_mean).const_data_ptr(),
                    kiln::as_tensor(*args->save_invstd).const_data_ptr(), d.relu.get(),
                    workspace.data_ptr(), workspace_size, reserve.data_ptr(),
                    static_cast<size_t>(reserve.numel())),
        "cudnnBatchNormalizationBackwardEx");
  grads = {dx, dw, db};
  return true;
}

}  // namespace kiln::norm::cudnn
