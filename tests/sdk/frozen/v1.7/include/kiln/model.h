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
} kiln_model_vtable;

#define KILN_MODEL_VTABLE_V1_SIZE KILN_SIZE_UP_TO(kiln_model_vtable, destroy)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_MODEL_H_ */
