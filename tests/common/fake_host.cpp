#include "fake_host.hpp"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <atomic>
#include <exception>
#include <vector>

#include "kiln/torch.hpp"

namespace kiln::test {
namespace {

std::atomic<NormLayerHook> g_norm_hook{nullptr};

at::Tensor new_state(const kiln_call_context& ctx, size_t param_index, int32_t init) {
  const at::Tensor& param = ctx.params[param_index];
  switch (init) {
    // In the parameter's layout, as the real host makes them (plugin/host_api.cpp).
    case KILN_STATE_ZEROS_LIKE_PARAM:
      return at::zeros_like(param);
    case KILN_STATE_COPY_OF_GRAD:
      if (param_index < ctx.grads.size()) {
        return at::empty_like(param).copy_(ctx.grads[param_index]);
      } else {
        at::Tensor t = at::zeros_like(param);
        if (param.grad().defined()) t.copy_(param.grad());
        return t;
      }
    case KILN_STATE_SCALAR_F64:
      return at::zeros({}, at::kDouble);
    case KILN_STATE_SCALAR_LIKE_PARAM:
      return at::zeros({}, param.options().dtype(at::kFloat));
    default:
      return at::Tensor();
  }
}

// Creates state as host/plugin/host_api.cpp does: row-major *_LIKE_PARAM tensors (whatever the
// parameter's strides), float32 0-dim step counters on the parameter's device.
kiln_status* state_tensor(kiln_call_context* ctx, size_t param_index, const char* name,
                          int32_t init, DLTensor* out, int32_t* created) {
  try {
    if (param_index >= ctx->fail_state_from) {
      return make_status(KILN_ERR_OUT_OF_MEMORY, "fake host: state refused");
    }
    if (param_index >= ctx->params.size()) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "state_tensor: parameter index out of range");
    }
    auto key = std::make_pair(param_index, std::string(name));
    auto it = ctx->state.find(key);
    const bool is_new = it == ctx->state.end();
    if (is_new) {
      at::Tensor t = new_state(*ctx, param_index, init);
      if (!t.defined()) {
        return make_status(KILN_ERR_INVALID_ARGUMENT, "state_tensor: unknown init kind");
      }
      it = ctx->state.emplace(key, t).first;
      ctx->state_init[key] = init;
    }
    *out = kiln::as_dltensor(it->second);
    if (created != nullptr) *created = is_new ? 1 : 0;
    return nullptr;
  } catch (const std::exception& e) {
    return make_status(KILN_ERR_INTERNAL, e.what());
  }
}

// As host/plugin/host_api.cpp: contiguous zeros of the plugin's shape and dtype on the
// parameter's device, the same shape and dtype asked for on every later request.
kiln_status* state_tensor_shaped(kiln_call_context* ctx, size_t param_index, const char* name,
                                 DLDataType dtype, int32_t ndim, const int64_t* shape,
                                 DLTensor* out, int32_t* created) {
  try {
    if (param_index >= ctx->fail_state_from) {
      return make_status(KILN_ERR_OUT_OF_MEMORY, "fake host: state refused");
    }
    if (param_index >= ctx->params.size() || ndim < 0 || ndim > 8 ||
        (ndim > 0 && shape == nullptr)) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "state_tensor_shaped: bad arguments");
    }
    const at::ScalarType type = dtype.code == kDLBfloat ? at::kBFloat16
                                : dtype.bits == 16      ? at::kHalf
                                : dtype.bits == 64      ? at::kDouble
                                                        : at::kFloat;
    const std::vector<int64_t> sizes(shape, shape + ndim);
    auto key = std::make_pair(param_index, std::string(name));
    auto it = ctx->state.find(key);
    const bool is_new = it == ctx->state.end();
    if (is_new) {
      it = ctx->state.emplace(key, at::zeros(sizes, ctx->params[param_index].options().dtype(type)))
               .first;
      ctx->state_init[key] = 0;  // shaped
    } else if (it->second.sizes() != at::IntArrayRef(sizes) || it->second.scalar_type() != type) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "state_tensor_shaped: another shape or dtype");
    }
    *out = kiln::as_dltensor(it->second);
    if (created != nullptr) *created = is_new ? 1 : 0;
    return nullptr;
  } catch (const std::exception& e) {
    return make_status(KILN_ERR_INTERNAL, e.what());
  }
}

void* current_stream(DLDevice) { return nullptr; }
int32_t rank(kiln_call_context*) { return 0; }
int32_t world_size(kiln_call_context*) { return 1; }
// One process: every collective is the identity.
kiln_status* allreduce(kiln_call_context*, DLTensor*, int32_t) { return nullptr; }
kiln_status* broadcast(kiln_call_context*, DLTensor*, int32_t) { return nullptr; }
kiln_status* allgather(kiln_call_context*, const DLTensor* in, DLTensor* out) {
  kiln::as_tensor(*out).copy_(kiln::as_tensor(*in).reshape(kiln::as_tensor(*out).sizes()));
  return nullptr;
}

kiln_status* create_norm_layer(const kiln_norm_request* request, kiln_torch_module** out) {
  NormLayerHook hook = g_norm_hook.load();
  if (hook == nullptr) return make_status(KILN_ERR_UNSUPPORTED, "fake host builds no norm layers");
  return hook(request, out);
}

}  // namespace

const kiln_host_api* fake_host() {
  static const kiln_host_api api = [] {
    kiln_host_api a = status_only_host();
    a.state_tensor = state_tensor;
    a.current_stream = current_stream;
    a.rank = rank;
    a.world_size = world_size;
    a.allreduce = allreduce;
    a.broadcast = broadcast;
    a.allgather = allgather;
    a.create_norm_layer = create_norm_layer;
    a.state_tensor_shaped = state_tensor_shaped;
    return a;
  }();
  return &api;
}

void set_norm_layer_hook(NormLayerHook hook) { g_norm_hook.store(hook); }

}  // namespace kiln::test
