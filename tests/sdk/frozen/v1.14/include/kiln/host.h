/*
 * kiln/host.h — services the host offers to plugins. The host fills one kiln_host_api and
 * passes it to plugin init and to every create function; the table and the functions in it stay
 * valid for the life of the process. The table holds no run's state: what belongs to a run (its
 * process group, its norm plugin) reaches a plugin through the kiln_call_context of a call.
 *
 * Thread-safety and blocking are stated per slot. "call context" arguments are the opaque
 * kiln_call_context* the host passed into the plugin function being executed; they are valid
 * only during that call.
 */
#ifndef KILN_HOST_H_
#define KILN_HOST_H_

#include "kiln/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque per-call context (which component instance, which parameter group, which process
 * group). Owned by the host; valid only during the call it was passed to. */
typedef struct kiln_call_context kiln_call_context;

/* Opaque handle of a LibTorch module owned by whoever the receiving function says. Only
 * torch-bound components (models) may look inside; see kiln/torch.hpp. */
typedef struct kiln_torch_module kiln_torch_module;

/* Log levels (stored as int32_t). */
enum { KILN_LOG_DEBUG = 0, KILN_LOG_INFO = 1, KILN_LOG_WARN = 2, KILN_LOG_ERROR = 3 };

/* How a state tensor is shaped and initialised when first requested (int32_t). */
enum {
  KILN_STATE_ZEROS_LIKE_PARAM = 1, /* same shape, dtype, device and strides as the parameter
                                      (channels_last weights: channels_last state), zeros */
  KILN_STATE_SCALAR_F64 = 2,       /* 0-dim float64 on CPU, zero (e.g. a step counter) */
  KILN_STATE_COPY_OF_GRAD = 3,     /* as ZEROS_LIKE_PARAM, initialised from the parameter's grad */
  KILN_STATE_SCALAR_LIKE_PARAM = 4 /* 0-dim float32 on the parameter's device, zero (torch's
                                      per-parameter "step" as fused optimizers keep it) */
};

/* Reduction operators for allreduce (int32_t). */
enum { KILN_REDUCE_SUM = 0, KILN_REDUCE_MAX = 1, KILN_REDUCE_MIN = 2 };

/* Activations a model asks to follow a norm layer (int32_t); a norm plugin may fuse them. */
enum {
  KILN_ACT_NONE = 0,       /* no activation */
  KILN_ACT_RELU = 1,       /* max(x, 0) */
  KILN_ACT_LEAKY_RELU = 2, /* x < 0 ? slope * x : x ; slope in activation_param */
  KILN_ACT_ELU = 3,        /* x < 0 ? alpha * (exp(x) - 1) : x ; alpha in activation_param */
  KILN_ACT_IDENTITY = 4    /* explicit identity */
};

/* What a model asks of the pipeline's norm layer. */
typedef struct kiln_norm_request {
  size_t struct_size;   /* sizeof(kiln_norm_request) as the caller knows it */
  int64_t num_features; /* channels (dimension 1 of the input) */
  int32_t activation;   /* KILN_ACT_* applied after normalisation */
  /* Since ABI 1.2 (was `reserved`, zero): nonzero when the model never reads the layer's input
   * after the layer has run, so an in-place layer (kiln_norm_layout.in_place) may overwrite it.
   * Zero: the host hands an in-place layer a copy, so the model's tensor stays intact. */
  int32_t may_overwrite_input;
  double activation_param; /* leaky_relu slope or elu alpha; ignored otherwise */
} kiln_norm_request;

/* One parameter group at one optimizer step (kiln/optimizer.h), for inner_step. */
struct kiln_param_group;

/* What kiln_host_api.reevaluate found (since ABI 1.14). */
typedef struct kiln_reevaluation {
  size_t struct_size; /* sizeof(kiln_reevaluation) as the plugin knows it; the host fills
                         the fields it covers */
  double loss;        /* mean loss of the window at the current weights, averaged over ranks */
  int32_t finite;     /* 0: some gradient is not finite (the plugin should then leave the
                         weights and its state as they were before the step) */
  int32_t reserved;   /* zero */
} kiln_reevaluation;

/* The host services table. */
typedef struct kiln_host_api {
  size_t struct_size; /* sizeof(kiln_host_api) as the host knows it */
  uint32_t abi_major; /* host's KILN_ABI_MAJOR */
  uint32_t abi_minor; /* host's KILN_ABI_MINOR */

  /* Creates a status with `code` and a copy of `message` (NULL allowed). Returns an owned
   * status to be returned to the host. Thread-safe; does not block. Never returns NULL. */
  KILN_MUST_USE_SLOT kiln_status* (*make_status)(int32_t code, const char* message);

  /* Writes one log line attributed to `component`. Both strings borrowed for the call.
   * Thread-safe; may block briefly on the log sink. */
  void (*log)(int32_t level, const char* component, const char* message);

  /* Returns, through `out`, a view of the host-owned state tensor `name` of parameter
   * `param_index` in the group being processed; it is created and initialised per `init`
   * (KILN_STATE_*) on first request and kept (and checkpointed) by the host afterwards.
   * `name` is borrowed; use PyTorch's names ("momentum_buffer", "exp_avg", "step").
   * `out` is filled as a borrowed view valid until the call that received `ctx` returns.
   * `*created` (may be NULL) is set to 1 when the tensor was just created, else 0.
   * While the step is captured as a CUDA graph (run.cuda_graph), creating a tensor is refused
   * with KILN_ERR_FAILED_PRECONDITION: every replay would initialise it again.
   * Not thread-safe for one ctx; does not block. */
  KILN_MUST_USE_SLOT kiln_status* (*state_tensor)(kiln_call_context* ctx, size_t param_index,
                                                  const char* name, int32_t init, DLTensor* out,
                                                  int32_t* created);

  /* Current compute stream for `device` (a cudaStream_t on CUDA), NULL on CPU. Thread-safe. */
  void* (*current_stream)(DLDevice device);

  /* Rank of this process in the component's process group, and the group's size (1 when not
   * distributed). Thread-safe; do not block. */
  int32_t (*rank)(kiln_call_context* ctx);
  int32_t (*world_size)(kiln_call_context* ctx);

  /* Collectives over the component's process group, on borrowed tensors, in place where the
   * name says so. They block until complete. Not thread-safe for one ctx. */
  KILN_MUST_USE_SLOT kiln_status* (*allreduce)(kiln_call_context* ctx, DLTensor* inout,
                                               int32_t reduce_op);
  KILN_MUST_USE_SLOT kiln_status* (*broadcast)(kiln_call_context* ctx, DLTensor* inout,
                                               int32_t root);
  /* `out` has world_size times the elements of `in`, rank-major. */
  KILN_MUST_USE_SLOT kiln_status* (*allgather)(kiln_call_context* ctx, const DLTensor* in,
                                               DLTensor* out);

  /* For torch-bound components (models) only: builds the pipeline's norm layer (from the norm
   * plugin, wrapped as a module with autograd) for `request`. `*out` receives a new handle owned
   * by the caller, taken over by kiln::make_norm_layer (kiln/torch.hpp). Not
   * thread-safe; call from the model's create function, on the thread that called it.
   * Since ABI 1.6 this is the compatibility path of create_norm_layer_in: it reaches the run
   * whose model create is in progress on the calling thread (one binding per thread, for the
   * length of that create call). */
  KILN_MUST_USE_SLOT kiln_status* (*create_norm_layer)(const kiln_norm_request* request,
                                                       kiln_torch_module** out);

  /* Code and message of a status a host service returned to the plugin (message owned by the
   * status). Thread-safe. */
  int32_t (*status_code)(const kiln_status* status);
  const char* (*status_message)(const kiln_status* status);

  /* Destroys a status the plugin received from a host service and does not pass back to the
   * host. NULL is ignored. Thread-safe. */
  void (*free_status)(kiln_status* status);

  /* Since ABI 1.6 (read only when struct_size covers it). create_norm_layer for the model being
   * built: `ctx` is kiln_model_input.ctx of the model's create call in progress, and names the
   * run whose norm plugin builds the layer, so two runs in one process never take each other's.
   * Same ownership as create_norm_layer. Not thread-safe for one ctx; call from the model's
   * create function (kiln::make_norm_layer picks this slot when it has a ctx). */
  KILN_MUST_USE_SLOT kiln_status* (*create_norm_layer_in)(kiln_call_context* ctx,
                                                          const kiln_norm_request* request,
                                                          kiln_torch_module** out);

  /* Since ABI 1.14 (read only when struct_size covers it). */

  /* The closure of torch.optim, for an optimizer's step_all only, with that call's args->ctx:
   * runs the forward and backward pass again at the parameters as the plugin has written them,
   * over the same micro-batches as the step's first pass (the same samples and augmentations;
   * dropout draws anew), and leaves the gradients there in every group's `grads` (the same
   * memory as in args): averaged over the window and over the ranks, the loss scale removed,
   * not clipped. The model's buffers (norm layers' running statistics) are put back as the first
   * pass left them. `out` (may be NULL) receives the loss and whether the gradients are finite.
   * Counted in the step's metrics (reevaluations). Blocks; not thread-safe for one ctx. */
  KILN_MUST_USE_SLOT kiln_status* (*reevaluate)(kiln_call_context* ctx, kiln_reevaluation* out);

  /* For a wrapper (KILN_CAP_WRAPS_OPTIMIZER) inside its step or step_all: steps the pipeline's
   * inner optimizer on `group` (borrowed; the wrapper may change lr or pass other gradient views
   * of the same shapes). `ctx` is the ctx of that group's call (step's ctx, or
   * args->group_contexts[g]). The inner optimizer's state is the host's, checkpointed apart from
   * the wrapper's ("inner." before its names). Not thread-safe for one ctx. */
  KILN_MUST_USE_SLOT kiln_status* (*inner_step)(kiln_call_context* ctx,
                                                const struct kiln_param_group* group);

  /* state_tensor for state of the plugin's own shape (SOAP's preconditioner matrices,
   * Adafactor's row and column statistics, LBFGS's history): a contiguous tensor of `ndim`
   * (0 to 8) dimensions `shape` and type `dtype` (float 16/32/64 or bfloat16), on the
   * parameter's device, zeros when created; kept, checkpointed and restored by the host like the
   * others. A later request for `name` must give the same dtype and shape, else
   * KILN_ERR_INVALID_ARGUMENT. `shape` is borrowed; `out`, `created` and the threading as for
   * state_tensor. */
  KILN_MUST_USE_SLOT kiln_status* (*state_tensor_shaped)(kiln_call_context* ctx, size_t param_index,
                                                         const char* name, DLDataType dtype,
                                                         int32_t ndim, const int64_t* shape,
                                                         DLTensor* out, int32_t* created);
} kiln_host_api;

#define KILN_HOST_API_V1_SIZE KILN_SIZE_UP_TO(kiln_host_api, free_status)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_HOST_H_ */
