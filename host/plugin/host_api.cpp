#include "plugin/host_api.hpp"

#include <ATen/Context.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <spdlog/spdlog.h>

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dist/process_group.hpp"
#include "kiln/torch.hpp"
#include "plugin/status.hpp"

namespace kiln::plugin {
namespace {

void log_line(int32_t level, const char* component, const char* message) {
  const char* who = component != nullptr ? component : "plugin";
  const char* what = message != nullptr ? message : "";
  switch (level) {
    case KILN_LOG_DEBUG:
      spdlog::debug("[{}] {}", who, what);
      break;
    case KILN_LOG_INFO:
      spdlog::info("[{}] {}", who, what);
      break;
    case KILN_LOG_WARN:
      spdlog::warn("[{}] {}", who, what);
      break;
    default:
      spdlog::error("[{}] {}", who, what);
      break;
  }
}

// The state slot `name` of parameter `param_index` in the call's group, created empty when
// absent; `*problem` says why there is none (a status to return).
at::Tensor* state_slot(kiln_call_context* ctx, size_t param_index, const char* name,
                       const DLTensor* out, const at::Tensor** param, kiln_status** problem) {
  if (ctx == nullptr || ctx->state == nullptr || ctx->params == nullptr) {
    *problem = make_status(KILN_ERR_FAILED_PRECONDITION,
                           "state_tensor is only available during an optimizer step");
    return nullptr;
  }
  if (param_index >= ctx->params->size() || param_index >= ctx->state->size() || name == nullptr ||
      out == nullptr) {
    *problem = make_status(KILN_ERR_INVALID_ARGUMENT,
                           ("state_tensor: parameter index " + std::to_string(param_index) +
                            " out of range, or NULL name/out")
                               .c_str());
    return nullptr;
  }
  *param = &(*ctx->params)[param_index];
  kiln::plugin::ParamState& states = *(*ctx->state)[param_index];
  auto it = states.find(std::string_view(name));
  if (it == states.end()) it = states.emplace(name, at::Tensor()).first;
  at::Tensor& slot = it->second;
  if (!slot.defined() && (*param)->is_cuda() &&
      c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    // Made inside the graph, its initialisation would run again on every replay. The refusal
    // fails the capture, and the run goes on eagerly (engine/graph_step.cpp).
    *problem = make_status(
        KILN_ERR_FAILED_PRECONDITION,
        ("state_tensor: '" + std::string(name) + "' of parameter " + std::to_string(param_index) +
         " is first asked for while the step is captured as a CUDA graph, "
         "whose every replay would initialise it again")
            .c_str());
    return nullptr;
  }
  return &slot;
}

kiln_status* state_tensor(kiln_call_context* ctx, size_t param_index, const char* name,
                          int32_t init, DLTensor* out, int32_t* created) {
  try {
    const at::Tensor* parameter = nullptr;
    kiln_status* problem = nullptr;
    at::Tensor* found = state_slot(ctx, param_index, name, out, &parameter, &problem);
    if (found == nullptr) return problem;
    const at::Tensor& param = *parameter;
    at::Tensor& slot = *found;
    const bool fresh = !slot.defined();
    if (fresh) {
      switch (init) {
        case KILN_STATE_ZEROS_LIKE_PARAM:
        case KILN_STATE_COPY_OF_GRAD:
          // In the parameter's layout (torch's preserve_format): under channels_last the
          // parameter, its gradient and its state then walk memory together, which the fused
          // optimizer kernels need (else they fall back to per-tensor loops).
          slot = at::zeros_like(param);
          if (init == KILN_STATE_COPY_OF_GRAD && param.grad().defined()) slot.copy_(param.grad());
          break;
        case KILN_STATE_SCALAR_F64:
          slot = at::zeros({}, at::TensorOptions().dtype(at::kDouble));
          break;
        case KILN_STATE_SCALAR_LIKE_PARAM:
          slot = at::zeros({}, param.options().dtype(at::kFloat));
          break;
        default:
          return make_status(KILN_ERR_INVALID_ARGUMENT,
                             ("state_tensor: unknown init kind " + std::to_string(init)).c_str());
      }
    }
    *out = kiln::as_dltensor(slot);
    if (created != nullptr) *created = fresh ? 1 : 0;
    return nullptr;
  } catch (const std::exception& e) {
    return make_status(KILN_ERR_INTERNAL, e.what());
  }
}

kiln_status* state_tensor_shaped(kiln_call_context* ctx, size_t param_index, const char* name,
                                 DLDataType dtype, int32_t ndim, const int64_t* shape,
                                 DLTensor* out, int32_t* created) {
  try {
    const bool floating =
        (dtype.code == kDLFloat && (dtype.bits == 16 || dtype.bits == 32 || dtype.bits == 64)) ||
        (dtype.code == kDLBfloat && dtype.bits == 16);
    if (!floating || dtype.lanes != 1 || ndim < 0 || ndim > 8 || (ndim > 0 && shape == nullptr)) {
      return make_status(KILN_ERR_INVALID_ARGUMENT,
                         "state_tensor_shaped: a float16/32/64 or bfloat16 dtype and 0 to 8 "
                         "dimensions are required");
    }
    std::vector<int64_t> sizes(shape, shape + ndim);
    for (int64_t d : sizes) {
      if (d < 0) return make_status(KILN_ERR_INVALID_ARGUMENT, "state_tensor_shaped: size < 0");
    }
    const at::ScalarType type = dtype.code == kDLBfloat ? at::kBFloat16
                                : dtype.bits == 16      ? at::kHalf
                                : dtype.bits == 32      ? at::kFloat
                                                        : at::kDouble;
    const at::Tensor* param = nullptr;
    kiln_status* problem = nullptr;
    at::Tensor* slot = state_slot(ctx, param_index, name, out, &param, &problem);
    if (slot == nullptr) return problem;
    const bool fresh = !slot->defined();
    if (fresh) {
      *slot = at::zeros(sizes, param->options().dtype(type));
    } else if (slot->sizes() != at::IntArrayRef(sizes) || slot->scalar_type() != type) {
      return make_status(
          KILN_ERR_INVALID_ARGUMENT,
          ("state_tensor_shaped: '" + std::string(name) + "' of parameter " +
           std::to_string(param_index) + " is " + c10::toString(slot->scalar_type()) + " " +
           c10::str(slot->sizes()) + "; asked for " + c10::toString(type) + " " +
           c10::str(at::IntArrayRef(sizes)))
              .c_str());
    }
    *out = kiln::as_dltensor(*slot);
    if (created != nullptr) *created = fresh ? 1 : 0;
    return nullptr;
  } catch (const std::exception& e) {
    return make_status(KILN_ERR_INTERNAL, e.what());
  }
}

void* current_stream(DLDevice device) {
  if (device.device_type != kDLCUDA || !at::hasCUDA()) return nullptr;
  try {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device.device_id))
        .stream();
  } catch (...) {
    return nullptr;
  }
}

dist::ProcessGroup* group_of(kiln_call_context* ctx) {
  return ctx != nullptr ? ctx->group : nullptr;
}

int32_t rank(kiln_call_context* ctx) {
  dist::ProcessGroup* g = group_of(ctx);
  return g != nullptr ? g->rank() : 0;
}
int32_t world_size(kiln_call_context* ctx) {
  dist::ProcessGroup* g = group_of(ctx);
  return g != nullptr ? g->world_size() : 1;
}

// A plugin's tensor for a collective. kiln::as_tensor trusts a DLTensor's device; here the
// driver is asked where CUDA memory lives (one query per collective, small beside it), because a
// host pointer marked CUDA would otherwise fault inside NCCL, asynchronously, and take the
// process with it.
at::Tensor collective_tensor(const DLTensor& t) {
  at::Tensor v = kiln::as_tensor(t);
  if (!v.is_cuda() || v.numel() == 0) return v;
  std::string where;
  try {
    const c10::Device device = at::globalContext().getDeviceFromPtr(t.data, c10::kCUDA);
    if (device == v.device()) return v;
    where = "on " + device.str();
  } catch (const c10::Error&) {
    where = "host memory, not registered with CUDA";
  }
  throw std::invalid_argument("a tensor marked " + v.device().str() + " whose memory is " + where);
}

// Collectives run on the call's c10d process group; without one (a single process) reductions
// and broadcasts are the identity and allgather is a copy.
kiln_status* allreduce(kiln_call_context* ctx, DLTensor* inout, int32_t op) {
  try {
    if (inout == nullptr) return make_status(KILN_ERR_INVALID_ARGUMENT, "allreduce: NULL tensor");
    const char* name = op == KILN_REDUCE_SUM   ? "sum"
                       : op == KILN_REDUCE_MAX ? "max"
                       : op == KILN_REDUCE_MIN ? "min"
                                               : nullptr;
    if (name == nullptr) {
      return make_status(KILN_ERR_INVALID_ARGUMENT,
                         ("allreduce: unknown reduction " + std::to_string(op)).c_str());
    }
    if (dist::ProcessGroup* g = group_of(ctx)) {
      at::Tensor t = collective_tensor(*inout);
      g->allreduce(t, name);
    }
    return nullptr;
  } catch (const std::invalid_argument& e) {
    return make_status(KILN_ERR_INVALID_ARGUMENT, (std::string("allreduce: ") + e.what()).c_str());
  } catch (const std::exception& e) {
    return make_status(KILN_ERR_INTERNAL, (std::string("allreduce: ") + e.what()).c_str());
  }
}

kiln_status* broadcast(kiln_call_context* ctx, DLTensor* inout, int32_t root) {
  try {
    if (inout == nullptr) return make_status(KILN_ERR_INVALID_ARGUMENT, "broadcast: NULL tensor");
    if (root < 0 || root >= world_size(ctx)) {
      return make_status(KILN_ERR_INVALID_ARGUMENT,
                         ("broadcast: root " + std::to_string(root) + " is not a rank").c_str());
    }
    if (dist::ProcessGroup* g = group_of(ctx)) {
      at::Tensor t = collective_tensor(*inout);
      g->broadcast(t, root);
    }
    return nullptr;
  } catch (const std::invalid_argument& e) {
    return make_status(KILN_ERR_INVALID_ARGUMENT, (std::string("broadcast: ") + e.what()).c_str());
  } catch (const std::exception& e) {
    return make_status(KILN_ERR_INTERNAL, (std::string("broadcast: ") + e.what()).c_str());
  }
}

kiln_status* allgather(kiln_call_context* ctx, const DLTensor* in, DLTensor* out) {
  try {
    if (in == nullptr || out == nullptr) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "allgather: NULL tensor");
    }
    at::Tensor src = collective_tensor(*in);
    at::Tensor dst = collective_tensor(*out);
    if (dst.numel() != src.numel() * world_size(ctx)) {
      return make_status(KILN_ERR_INVALID_ARGUMENT,
                         ("allgather: output has " + std::to_string(dst.numel()) +
                          " elements, expected " + std::to_string(src.numel() * world_size(ctx)))
                             .c_str());
    }
    if (dist::ProcessGroup* g = group_of(ctx)) {
      g->allgather(src, dst);
    } else {
      dst.copy_(src.reshape(dst.sizes()));
    }
    return nullptr;
  } catch (const std::invalid_argument& e) {
    return make_status(KILN_ERR_INVALID_ARGUMENT, (std::string("allgather: ") + e.what()).c_str());
  } catch (const std::exception& e) {
    return make_status(KILN_ERR_INTERNAL, (std::string("allgather: ") + e.what()).c_str());
  }
}

// The model create call in progress on this thread (ModelCreateBinding): thread-local, so two
// runs built at once on two threads each reach their own.
thread_local kiln_call_context* t_model_create = nullptr;

kiln_status* create_norm_layer_in(kiln_call_context* ctx, const kiln_norm_request* request,
                                  kiln_torch_module** out) {
  try {
    if (request == nullptr || out == nullptr) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "create_norm_layer: NULL argument");
    }
    if (ctx == nullptr || ctx->norm_factory == nullptr || !*ctx->norm_factory) {
      return make_status(KILN_ERR_FAILED_PRECONDITION,
                         "create_norm_layer: no norm plugin is configured for this model "
                         "(call it from the model's create function)");
    }
    *out = kiln::release_norm_layer((*ctx->norm_factory)(*request));
    return nullptr;
  } catch (const std::exception& e) {
    // The status carries the reason to the model, whose error repeats it (kiln::make_norm_layer);
    // logging it here too would print it twice.
    spdlog::debug("norm layer: {}", e.what());
    return make_status(KILN_ERR_FAILED_PRECONDITION, e.what());
  }
}

// The 1.x slot: the model create call bound to this thread.
kiln_status* create_norm_layer(const kiln_norm_request* request, kiln_torch_module** out) {
  return create_norm_layer_in(t_model_create, request, out);
}

// The closure of torch.optim for a step_all call (optimizer_step.cpp runs it).
kiln_status* reevaluate(kiln_call_context* ctx, kiln_reevaluation* out) {
  try {
    if (ctx == nullptr || ctx->reevaluate == nullptr || !*ctx->reevaluate) {
      return make_status(KILN_ERR_FAILED_PRECONDITION,
                         "reevaluate is only available inside an optimizer's step_all, with that "
                         "call's args->ctx");
    }
    if (out != nullptr && out->struct_size < KILN_SIZE_UP_TO(kiln_reevaluation, finite)) {
      return make_status(KILN_ERR_INVALID_ARGUMENT,
                         "reevaluate: out->struct_size is smaller than kiln_reevaluation of ABI "
                         "1.14 (set it to sizeof(kiln_reevaluation))");
    }
    const kiln_reevaluation result = (*ctx->reevaluate)();
    if (out != nullptr) {
      out->loss = result.loss;
      out->finite = result.finite;
    }
    return nullptr;
  } catch (const std::exception& e) {
    return make_status(KILN_ERR_INTERNAL, (std::string("reevaluate: ") + e.what()).c_str());
  } catch (...) {
    return make_status(KILN_ERR_INTERNAL, "reevaluate: unknown exception");
  }
}

// A wrapper's call of its inner optimizer (adapters.cpp builds the step).
kiln_status* inner_step(kiln_call_context* ctx, const kiln_param_group* group) {
  try {
    if (ctx == nullptr || ctx->inner_step == nullptr || !*ctx->inner_step) {
      return make_status(KILN_ERR_FAILED_PRECONDITION,
                         "inner_step is only available to an optimizer that wraps another "
                         "(KILN_CAP_WRAPS_OPTIMIZER), inside its step or step_all, with that "
                         "group's ctx");
    }
    if (group == nullptr || group->struct_size < KILN_SIZE_UP_TO(kiln_param_group, weight_decay)) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "inner_step: NULL or too small group");
    }
    (*ctx->inner_step)(*group);
    return nullptr;
  } catch (const std::exception& e) {
    return make_status(KILN_ERR_INTERNAL, e.what());
  } catch (...) {
    return make_status(KILN_ERR_INTERNAL, "inner_step: unknown exception");
  }
}

const kiln_host_api kTable = {
    sizeof(kiln_host_api),
    KILN_ABI_MAJOR,
    KILN_ABI_MINOR,
    make_status,
    log_line,
    state_tensor,
    current_stream,
    rank,
    world_size,
    allreduce,
    broadcast,
    allgather,
    create_norm_layer,
    status_code,
    status_message,
    free_status,
    create_norm_layer_in,
    reevaluate,
    inner_step,
    state_tensor_shaped,
};

}  // namespace

const kiln_host_api* host_api() { return &kTable; }

ModelCreateBinding::ModelCreateBinding(kiln_call_context* ctx) : previous_(t_model_create) {
  t_model_create = ctx;
}

ModelCreateBinding::~ModelCreateBinding() { t_model_create = previous_; }

kiln_status* make_status(int32_t code, const char* message) noexcept {
  try {
    return new kiln_status{code, message != nullptr ? message : "", {}};
  } catch (...) {
    // Out of memory while reporting an error: a static status would be freed by the host, so
    // the best we can do is one without a message.
    return new (std::nothrow) kiln_status{KILN_ERR_OUT_OF_MEMORY, {}, {}};
  }
}

int32_t status_code(const kiln_status* status) noexcept {
  return status != nullptr ? status->code : KILN_OK;
}
const char* status_message(const kiln_status* status) noexcept {
  return status != nullptr ? status->message.c_str() : "";
}
void free_status(kiln_status* status) noexcept { delete status; }

std::string take_message(kiln_status* status) {
  if (status == nullptr) return {};
  std::string message = std::move(status->message);
  delete status;
  return message;
}

void check(kiln_status* status, const std::string& context) {
  if (status == nullptr) return;
  int32_t code = status->code;
  std::string message = take_message(status);
  throw ComponentError(code, context + ": " + message);
}

void check_options(kiln_status* status, const std::string& context, const char* section) {
  if (status == nullptr) return;
  int32_t code = status->code;
  std::string message = take_message(status);
  throw OptionsRefused(code, context + ": " + message, section, message);
}

}  // namespace kiln::plugin
