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

/* The optimizer vtable (kiln_component_descriptor.vtable for KILN_COMPONENT_OPTIMIZER). */
typedef struct kiln_optimizer_vtable {
  size_t struct_size; /* sizeof(kiln_optimizer_vtable) as the plugin knows it */

  /* Required. Creates an instance from validated options (borrowed for the call). `*out`
   * receives instance state owned by the plugin, released by `destroy`. */
  KILN_MUST_USE_SLOT kiln_status* (*create)(const kiln_host_api* host, const kiln_options* options,
                                            void** out);

  /* Required. Releases an instance created by `create`. NULL is ignored. */
  void (*destroy)(void* instance);

  /* Required. Applies one update to every parameter of `group`. `ctx` identifies the group for
   * state_tensor. Called from the training thread; never concurrently for one instance. */
  KILN_MUST_USE_SLOT kiln_status* (*step)(void* instance, kiln_call_context* ctx,
                                          const kiln_param_group* group);
} kiln_optimizer_vtable;

/* The vtable with every slot named: KILN_OPTIMIZER_VTABLE_INIT(create, destroy, step). */
#define KILN_OPTIMIZER_VTABLE_INIT(create_, destroy_, step_)                                     \
  {                                                                                              \
    KILN_FIELD_(struct_size)                                                                     \
    sizeof(kiln_optimizer_vtable), KILN_FIELD_(create)(create_), KILN_FIELD_(destroy)(destroy_), \
        KILN_FIELD_(step)(step_)                                                                 \
  }
#define KILN_OPTIMIZER_VTABLE_V1_SIZE KILN_SIZE_UP_TO(kiln_optimizer_vtable, step)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_OPTIMIZER_H_ */
