/*
 * kiln/model.h — the model component. Models are bound to the LibTorch build: they hand back a
 * torch module through an opaque handle (see kiln/torch.hpp for the C++ side). Their plugin
 * descriptor must record torch_version and torch_cxx11_abi; the host refuses a mismatch.
 */
#ifndef KILN_MODEL_H_
#define KILN_MODEL_H_

#include "kiln/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The data the model will see (filled by the host, borrowed for the call). */
typedef struct kiln_model_input {
  size_t struct_size;  /* sizeof(kiln_model_input) as the host knows it */
  int64_t channels;    /* input channels (1 for Fashion-MNIST) */
  int64_t height;      /* input height in pixels */
  int64_t width;       /* input width in pixels */
  int64_t num_classes; /* output logits per sample */
  /* Since ABI 1.6 (read only when struct_size covers it): the create call's context, borrowed
   * for the call; pass it to kiln_host_api.create_norm_layer_in (kiln::make_norm_layer does). */
  kiln_call_context* ctx;
} kiln_model_input;

/* Since ABI 1.8: an at::Tensor that crosses the model ABI, opaque to C. kiln/torch.hpp reads one
 * (kiln::tensor_of) and assigns one (kiln::set_tensor). */
typedef struct kiln_torch_tensor kiln_torch_tensor;

/* Since ABI 1.8: what a model's `loss` slot gets (filled by the host, borrowed for the call). */
typedef struct kiln_model_loss_args {
  size_t struct_size; /* sizeof(kiln_model_loss_args) as the host knows it */
  int32_t training;   /* 1: a training step (backward follows); 0: evaluation, under no_grad */
  int32_t reserved;   /* zero */
  /* The call's context, borrowed for the call: kiln_host_api.rank(ctx), world_size(ctx) and the
   * collectives reach the run's ranks through it. */
  kiln_call_context* ctx;
  /* Borrowed for the call: the model's forward output for the batch ([N, classes] logits, in
   * the dtype forward returned). */
  const kiln_torch_tensor* output;
  /* Borrowed for the call, on the output's device: int64 class labels [N], or, in training with
   * mixup/cutmix, float32 soft targets [N, classes] (rows summing to 1). */
  const kiln_torch_tensor* target;
  /* Out, owned by the host: the plugin assigns the batch's loss, a scalar floating tensor on the
   * output's device (the mean over the batch, which backward differentiates in training). */
  kiln_torch_tensor* loss;
} kiln_model_loss_args;

/* The model vtable (kiln_component_descriptor.vtable for KILN_COMPONENT_MODEL). */
typedef struct kiln_model_vtable {
  size_t struct_size; /* sizeof(kiln_model_vtable) as the plugin knows it */

  /* Required. Builds the model. `*out` receives a new handle owned by the host, released with
   * `destroy`; it wraps a kiln::Model (kiln/torch.hpp). Norm layers come from
   * host->create_norm_layer_in(input->ctx, ...) (kiln::make_norm_layer). Called from one
   * thread. */
  KILN_MUST_USE_SLOT kiln_status* (*create)(const kiln_host_api* host, const kiln_options* options,
                                            const kiln_model_input* input, kiln_torch_module** out);

  /* Required. Releases a handle from `create`. The module itself lives on while the host holds
   * references to it. NULL is ignored. */
  void (*destroy)(kiln_torch_module* model);

  /* Optional (ABI 1.8; read only when struct_size covers it). The model's own loss: the host
   * trains and evaluates with it instead of its [loss] section (whose keys must then keep their
   * defaults). `model` is a handle to the model `create` built, borrowed for the call
   * (kiln::model_from_handle). Called under the run's autocast, as forward is, once per
   * micro-batch; in training inside autograd, in evaluation under no_grad. It must not read
   * tensors back to the host (no .item()): the step stays asynchronous, and a CUDA-graphed step
   * (run.cuda_graph) captures it. NULL: the host's loss. */
  KILN_MUST_USE_SLOT kiln_status* (*loss)(kiln_torch_module* model,
                                          const kiln_model_loss_args* args);
} kiln_model_vtable;

#define KILN_MODEL_VTABLE_V1_SIZE KILN_SIZE_UP_TO(kiln_model_vtable, destroy)
#define KILN_MODEL_VTABLE_V1_8_SIZE KILN_SIZE_UP_TO(kiln_model_vtable, loss)

/* The vtable with every slot named: KILN_MODEL_VTABLE_INIT(create, destroy) (the host's loss),
 * KILN_MODEL_VTABLE_LOSS_INIT(create, destroy, loss) (the model's own, ABI 1.8). */
#define KILN_MODEL_VTABLE_INIT(create_, destroy_) \
  KILN_MODEL_VTABLE_LOSS_INIT(create_, destroy_, NULL)
#define KILN_MODEL_VTABLE_LOSS_INIT(create_, destroy_, loss_)                                \
  {                                                                                          \
    KILN_FIELD_(struct_size)                                                                 \
    sizeof(kiln_model_vtable), KILN_FIELD_(create)(create_), KILN_FIELD_(destroy)(destroy_), \
        KILN_FIELD_(loss)(loss_)                                                             \
  }

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_MODEL_H_ */
