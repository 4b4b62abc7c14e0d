/*
 * kiln/optimizer.h — the optimizer component. The host calls `step` once per parameter group per
 * optimizer step, with the whole group; the plugin updates every parameter in place and keeps
 * its state in host-allocated tensors (kiln_host_api.state_tensor) so checkpoints need no
 * knowledge of the plugin.
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
} kiln_param_group;

/* The optimizer vtable (kiln_component_descriptor.vtable for KILN_COMPONENT_OPTIMIZER). */
typedef struct kiln_optimizer_vtable {
  size_t struct_size; /* sizeof(kiln_optimizer_vtable) as the plugin knows it */

  /* Required. Creates an instance from validated options (borrowed for the call). `*out`
   * receives instance state owned by the plugin, released by `destroy`. */
  kiln_status* (*create)(const kiln_host_api* host, const kiln_options* options, void** out);

  /* Required. Releases an instance created by `create`. NULL is ignored. */
  void (*destroy)(void* instance);

  /* Required. Applies one update to every parameter of `group`. `ctx` identifies the group for
   * state_tensor. Called from the training thread; never concurrently for one instance. */
  kiln_status* (*step)(void* instance, kiln_call_context* ctx, const kiln_param_group* group);
} kiln_optimizer_vtable;

#define KILN_OPTIMIZER_VTABLE_V1_SIZE KILN_SIZE_UP_TO(kiln_optimizer_vtable, step)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_OPTIMIZER_H_ */
