/*
 * kiln/optimizer.h — the optimizer component. The host calls `step` once per parameter group per
 * optimizer step, with the whole group; the plugin updates every parameter in place and keeps
 * its state in host-allocated tensors (kiln_host_api.state_tensor) so checkpoints need no
 * knowledge of the plugin.
 *
 * CAPTURABLE STEPS (since ABI 1.4). A plugin that declares KILN_CAP_CAPTURABLE lets the host
 * record its `step` into a CUDA graph (run.cuda_graph) and replay it every later step. When the
 * host passes `lr_tensor` (non-NULL), the call must:
 *  - take the learning rate from `lr_tensor` and leave parameters and state untouched when
 *    `found_inf` is nonzero, both read on the device only (the values change between replays);
 *  - not depend on `lr` or `step` (stale in a replay) and never copy device values to the host
 *    or synchronise;
 *  - keep per-parameter counters (Adam's step) in state tensors on the device.
 * Without lr_tensor the call is an ordinary eager step.
 *
 * SINCE ABI 1.14 an optimizer may also (docs/plugin-guide.md has a section and a plain-C example
 * for each):
 *  - give EVALUATION WEIGHTS (eval_weights): the weights evaluation and `kiln export` see,
 *    computed from the training weights and the state without changing either (Schedule-Free
 *    trains at y and evaluates at x);
 *  - take the WHOLE STEP in one call (step_all): every group at once, and inside that call ask
 *    the host for the loss and gradients at other weights (kiln_host_api.reevaluate), as a
 *    closure does in torch.optim (SAM, ASAM, LBFGS);
 *  - WRAP another optimizer (KILN_CAP_WRAPS_OPTIMIZER): step the pipeline's [optimizer.inner],
 *    any optimizer plugin, through kiln_host_api.inner_step; the host keeps both states
 *    (Lookahead).
 * Which parameters an optimizer steps is the host's business: [[optimizer.partition]] hands
 * some of them to another optimizer (Muon on 2-D weights, AdamW on the rest), and each plugin
 * sees only the groups of its own parameters (group_index still numbers the whole plan).
 */
#ifndef KILN_OPTIMIZER_H_
#define KILN_OPTIMIZER_H_

#include "kiln/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One parameter group at one optimizer step. All pointers borrowed for the call. */
typedef struct kiln_param_group {
  size_t struct_size;       /* sizeof(kiln_param_group) as the host knows it */
  size_t count;             /* parameters in the group */
  const DLTensor* params;   /* `count` parameter views; the plugin writes them in place */
  const DLTensor* grads;    /* `count` gradient views, same shapes as params; read only */
  const char* const* names; /* `count` parameter names ("layer1.0.conv1.weight") */
  size_t group_index;       /* index of the group in the pipeline's plan */
  int64_t step;             /* 1-based count of applied optimizer steps, this one included */
  double lr;                /* learning rate for this group at this step (schedule × scale) */
  double weight_decay;      /* weight decay for this group (base × decay_mult) */
  void* stream;             /* compute stream of the tensors' device (cudaStream_t) or NULL */
  /* Since ABI 1.4 (check KILN_HAS_FIELD before reading the fields below). */
  /* Nonzero: `params`, `names` and the state tensors of this group are the same (memory, shapes,
   * strides) as in the last call with this group_index that carried the same value, so the
   * plugin may reuse what it built from them then; `grads` are new views every call. The host
   * changes it whenever any of them may change. 0: no promise. */
  uint64_t reuse_token;
  /* Capturable steps only (see above), else NULL: 0-dim float32 tensor on the params' device
   * holding this group's lr, written by the host before every replay. Borrowed; the same
   * memory on every call of a run. */
  const DLTensor* lr_tensor;
  /* With lr_tensor, else NULL: 0-dim float32 tensor on the params' device, nonzero when this
   * step's gradients are not finite (the update must then change nothing). Borrowed; the same
   * memory on every call of a run. */
  const DLTensor* found_inf;
} kiln_param_group;

/* sizeof(kiln_param_group) as ABI 1.0 to 1.3 knew it. */
#define KILN_PARAM_GROUP_V1_0_SIZE KILN_SIZE_UP_TO(kiln_param_group, stream)

/* One optimizer step over every group of an optimizer (step_all, ABI 1.14). Borrowed for the call.
 */
typedef struct kiln_optimizer_step_args {
  size_t struct_size;             /* sizeof(kiln_optimizer_step_args) as the host knows it */
  size_t group_count;             /* entries in groups and group_contexts */
  const kiln_param_group* groups; /* this optimizer's groups, in the plan's order */
  /* Per group: that group's ctx, for state_tensor and inner_step. */
  kiln_call_context* const* group_contexts;
  /* The step's own ctx: for reevaluate and the collectives (rank, allreduce, ...). */
  kiln_call_context* ctx;
  /* The window's mean loss at the weights `grads` were taken at, averaged over the ranks. */
  double loss;
} kiln_optimizer_step_args;

/* The optimizer vtable (kiln_component_descriptor.vtable for KILN_COMPONENT_OPTIMIZER). */
typedef struct kiln_optimizer_vtable {
  size_t struct_size; /* sizeof(kiln_optimizer_vtable) as the plugin knows it */

  /* Required. Creates an instance from validated options (borrowed for the call). `*out`
   * receives instance state owned by the plugin, released by `destroy`. */
  KILN_MUST_USE_SLOT kiln_status* (*create)(const kiln_host_api* host, const kiln_options* options,
                                            void** out);

  /* Required. Releases an instance created by `create`. NULL is ignored. */
  void (*destroy)(void* instance);

  /* Required unless step_all is given (ABI 1.14). Applies one update to every parameter of
   * `group`. `ctx` identifies the group for state_tensor. Called from the training thread;
   * never concurrently for one instance. */
  KILN_MUST_USE_SLOT kiln_status* (*step)(void* instance, kiln_call_context* ctx,
                                          const kiln_param_group* group);

  /* Since ABI 1.14 (the host reads a slot only when struct_size covers it). */

  /* Optional. Writes into `out[i]` (group->count tensors, each shaped, typed and placed like
   * params[i]; host-owned, borrowed for the call) the weights evaluation should see, from the
   * training weights in `params` and the state (ctx, as in step). Must change neither. `grads`
   * is NULL; `lr` and `step` are those of the last applied step (0 before any). NULL slot:
   * evaluation sees the training weights. Called from the training thread. */
  KILN_MUST_USE_SLOT kiln_status* (*eval_weights)(void* instance, kiln_call_context* ctx,
                                                  const kiln_param_group* group,
                                                  const DLTensor* out);

  /* Optional; with it `step` may be NULL. One call per optimizer step for all of this
   * optimizer's groups, made instead of `step` (which the host then never calls). Inside it, and
   * only there, the plugin may call kiln_host_api.reevaluate(args->ctx, ...). */
  KILN_MUST_USE_SLOT kiln_status* (*step_all)(void* instance, const kiln_optimizer_step_args* args);
} kiln_optimizer_vtable;

/* sizeof(kiln_optimizer_vtable) as ABI 1.0 to 1.13 knew it (create, destroy, step). */
#define KILN_OPTIMIZER_VTABLE_V1_13_SIZE KILN_SIZE_UP_TO(kiln_optimizer_vtable, step)

/* The vtable of ABI 1.14 with every slot named (NULL where the plugin has none):
 * KILN_OPTIMIZER_VTABLE_FULL_INIT(create, destroy, step, eval_weights, step_all). */
#define KILN_OPTIMIZER_VTABLE_FULL_INIT(create_, destroy_, step_, eval_weights_, step_all_)      \
  {                                                                                              \
    KILN_FIELD_(struct_size)                                                                     \
    sizeof(kiln_optimizer_vtable), KILN_FIELD_(create)(create_), KILN_FIELD_(destroy)(destroy_), \
        KILN_FIELD_(step)(step_), KILN_FIELD_(eval_weights)(eval_weights_),                      \
        KILN_FIELD_(step_all)(step_all_)                                                         \
  }

/* The vtable of an optimizer with `step` alone (the slots of ABI 1.14 NULL):
 * KILN_OPTIMIZER_VTABLE_INIT(create, destroy, step). */
#define KILN_OPTIMIZER_VTABLE_INIT(create_, destroy_, step_) \
  KILN_OPTIMIZER_VTABLE_FULL_INIT(create_, destroy_, step_, NULL, NULL)
#define KILN_OPTIMIZER_VTABLE_V1_SIZE KILN_SIZE_UP_TO(kiln_optimizer_vtable, step)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_OPTIMIZER_H_ */
