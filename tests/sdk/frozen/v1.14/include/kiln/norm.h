/*
 * kiln/norm.h — the normalisation component. The host owns parameters, running statistics and
 * autograd; the plugin computes forward and backward on borrowed DLTensor views. The input is
 * laid out N×C×(spatial…) with C = kiln_norm_setup.num_features.
 */
#ifndef KILN_NORM_H_
#define KILN_NORM_H_

#include "kiln/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which tensor the plugin needs in backward (int32_t). */
enum {
  KILN_NORM_SAVE_INPUT = 1,   /* the host keeps the forward input for backward */
  KILN_NORM_SAVE_OUTPUT = 2,  /* the host keeps the forward output (in-place layers) */
  KILN_NORM_SAVE_NOTHING = 3, /* since ABI 1.2: backward needs neither; `saved` is then NULL */
  /* Since ABI 1.12: the host keeps both, the input as `saved` and the output as
   * kiln_norm_backward_args.saved_output (a layer applying its activation whose backward wants the
   * activation's output, as cuDNN's fused batch norm + ReLU does). Set it only under a host whose
   * abi_minor is 12 or later: an older one keeps the input alone and lends no output. */
  KILN_NORM_SAVE_INPUT_AND_OUTPUT = 4
};

/* One layer's configuration, passed to create (borrowed for the call). */
typedef struct kiln_norm_setup {
  size_t struct_size;   /* sizeof(kiln_norm_setup) as the host knows it */
  int64_t num_features; /* channels */
  int32_t activation;   /* KILN_ACT_* the model wants after the norm */
  /* Since ABI 1.5 (was `reserved`, zero): the ranks of the run the layer will train in (1 when
   * not distributed), so a synchronised layer can refuse a grouping the world cannot have at
   * create, before training; 0 from an older host (unknown until the first forward). */
  int32_t world_size;
  double activation_param; /* leaky_relu slope / elu alpha */
  /* Since ABI 1.9 (read only when struct_size covers it): the DLDeviceType (kDLCPU, kDLCUDA, …)
   * of the device the run trains this layer on, so a plugin can choose a layout that suits it
   * (fused CPU kernels, say); 0 from an older host (unknown). A hint: the layer must still
   * compute correctly on any device it is given. */
  int32_t device_type;
  int32_t reserved; /* zero */
} kiln_norm_setup;

/* What the plugin tells the host about a created layer (filled by the plugin in create). */
typedef struct kiln_norm_layout {
  size_t struct_size;       /* set by the host to the size it knows; the plugin fills up to it */
  int32_t affine;           /* nonzero: host allocates weight (ones) and bias (zeros), [C] */
  int32_t running_stats;    /* nonzero: host allocates running_mean (0), running_var (1), [C] */
  int32_t saves;            /* KILN_NORM_SAVE_* */
  int32_t fused_activation; /* nonzero: the plugin applies setup.activation itself */
  /* Since ABI 1.2. Nonzero: forward writes its output over its input (args.output and
   * args.input are then the same memory), so the layer keeps one tensor instead of two. The
   * host passes a copy when the model did not allow overwriting (may_overwrite_input). */
  int32_t in_place;
  /* Since ABI 1.2. Nonzero: weight and bias are fixed (the host keeps them as buffers, which
   * checkpoints and weight files hold but no optimizer updates); backward leaves grad_weight
   * and grad_bias NULL. */
  int32_t frozen;
  /* Since ABI 1.3. Nonzero: backward hands over gradients it allocated instead of writing into
   * host buffers, which saves a copy per gradient. The host then passes grad_input, grad_weight
   * and grad_bias with `data` NULL (shape, dtype and device say what it expects) and takes the
   * results from kiln_norm_backward_args.*_result. Set it only when this struct's struct_size
   * covers the field (an older host has no buffers-free backward). */
  int32_t hands_over_gradients;
} kiln_norm_layout;

/* Since ABI 1.5. Where a training forward reports the batch statistics it normalised with, for
 * a host that updates the running statistics itself (kiln_norm_forward_args.batch_stats; the
 * host does so under gradient accumulation when norm.running_stats_update asks for it). The
 * host sets struct_size, mean and var; the plugin writes everything else. */
typedef struct kiln_norm_batch_stats {
  size_t struct_size; /* sizeof(kiln_norm_batch_stats) as the host knows it */
  DLTensor* mean;     /* [C] float32: the plugin writes the batch mean */
  DLTensor* var;      /* [C] float32: the plugin writes the unbiased batch variance (N - 1) */
  double count;       /* values per channel behind mean and var, over every rank that shared them */
  double momentum;    /* the weight the plugin's own running-statistics update would give them */
  int32_t reported;   /* the plugin sets it nonzero once it has written the fields above */
  int32_t reserved;   /* zero */
} kiln_norm_batch_stats;

/* Forward arguments. Tensors borrowed for the call; optional ones NULL when absent. */
typedef struct kiln_norm_forward_args {
  size_t struct_size;     /* sizeof(kiln_norm_forward_args) as the host knows it */
  int32_t training;       /* nonzero: batch statistics (and running-stat update) */
  int32_t reserved;       /* zero */
  const DLTensor* input;  /* N×C×… */
  DLTensor* output;       /* same shape; the same memory as input when layout.in_place */
  const DLTensor* weight; /* [C] or NULL */
  const DLTensor* bias;   /* [C] or NULL */
  DLTensor* running_mean; /* [C] float32, updated in training, or NULL */
  DLTensor* running_var;  /* [C] float32 (unbiased), updated in training, or NULL */
  DLTensor* save_mean;    /* [C] float32 written by the plugin for backward */
  DLTensor* save_invstd;  /* [C] float32 written by the plugin for backward */
  void* stream;           /* device stream or NULL */
  /* Since ABI 1.5; NULL unless the host updates the running statistics itself (training only).
   * When non-NULL, running_mean and running_var are NULL: the plugin normalises with the batch
   * statistics as always, updates nothing, and fills *batch_stats (count and variance over
   * every rank that shared the statistics). A host passes it only to plugins built for 1.5 or
   * later, and refuses a forward that leaves batch_stats->reported zero. */
  kiln_norm_batch_stats* batch_stats;
  /* Since ABI 1.11; NULL from an older host. A host slot holding NULL where forward may store a
   * tensor it allocated for its own backward, such as cuDNN's reserve space (any shape, dtype and
   * device). Ownership passes to the host, which keeps it untouched with the saved tensors, lends
   * it back as kiln_norm_backward_args.reserve, and calls the deleter once, on any thread, when
   * autograd frees them; also at once when forward fails. Leave it NULL to keep nothing. */
  DLManagedTensor** reserve_result;
} kiln_norm_forward_args;

/* Backward arguments. Tensors borrowed for the call; optional ones NULL when not wanted. */
typedef struct kiln_norm_backward_args {
  size_t struct_size;           /* sizeof(kiln_norm_backward_args) as the host knows it */
  int32_t training;             /* value the forward ran with */
  int32_t reserved;             /* zero */
  const DLTensor* grad_output;  /* N×C×… */
  const DLTensor* saved;        /* the forward input or output per layout.saves (the input for
                                 * KILN_NORM_SAVE_INPUT_AND_OUTPUT); NULL for
                                 * KILN_NORM_SAVE_NOTHING */
  const DLTensor* weight;       /* [C] or NULL */
  const DLTensor* bias;         /* [C] or NULL */
  const DLTensor* running_mean; /* [C] or NULL (used when not training) */
  const DLTensor* running_var;  /* [C] or NULL (used when not training) */
  const DLTensor* save_mean;    /* [C] from forward */
  const DLTensor* save_invstd;  /* [C] from forward */
  DLTensor* grad_input;         /* N×C×… written by the plugin */
  DLTensor* grad_weight;        /* [C] or NULL */
  DLTensor* grad_bias;          /* [C] or NULL */
  void* stream;                 /* device stream or NULL */
  /* Since ABI 1.3; non-NULL only when layout.hands_over_gradients, and then exactly for the
   * wanted gradients. Each points to a host slot holding NULL, where the plugin stores a tensor
   * it allocated, of the shape, dtype and device the matching grad_* describes (any strides).
   * Ownership passes to the host, which calls the deleter once, on any thread, when autograd is
   * done with it; also when backward fails or the tensor does not match, which it refuses. */
  DLManagedTensor** grad_input_result;
  DLManagedTensor** grad_weight_result;
  DLManagedTensor** grad_bias_result;
  /* Since ABI 1.11; what this layer's forward stored in *reserve_result, borrowed for the call;
   * NULL when it stored nothing, and from an older host. */
  const DLTensor* reserve;
  /* Since ABI 1.12; the forward's output, borrowed for the call, when layout.saves is
   * KILN_NORM_SAVE_INPUT_AND_OUTPUT (after the layer's own activation when it applies one);
   * NULL otherwise, and from an older host. */
  const DLTensor* saved_output;
} kiln_norm_backward_args;

/* The norm vtable (kiln_component_descriptor.vtable for KILN_COMPONENT_NORM). */
typedef struct kiln_norm_vtable {
  size_t struct_size; /* sizeof(kiln_norm_vtable) as the plugin knows it */

  /* Required. Creates one layer's instance; fills `*layout`. `*out` is plugin-owned state. */
  KILN_MUST_USE_SLOT kiln_status* (*create)(const kiln_host_api* host, const kiln_options* options,
                                            const kiln_norm_setup* setup, kiln_norm_layout* layout,
                                            void** out);

  /* Required. Releases an instance. NULL is ignored. */
  void (*destroy)(void* instance);

  /* Required. Normalises (and activates when layout.fused_activation). `ctx` gives collectives.
   * Called from the thread running the model; never concurrently for one instance. */
  KILN_MUST_USE_SLOT kiln_status* (*forward)(void* instance, kiln_call_context* ctx,
                                             const kiln_norm_forward_args* args);

  /* Required. Gradients for input, weight and bias. Same threading as forward. */
  KILN_MUST_USE_SLOT kiln_status* (*backward)(void* instance, kiln_call_context* ctx,
                                              const kiln_norm_backward_args* args);
} kiln_norm_vtable;

/* The vtable with every slot named: KILN_NORM_VTABLE_INIT(create, destroy, forward, backward). */
#define KILN_NORM_VTABLE_INIT(create_, destroy_, forward_, backward_)                       \
  {                                                                                         \
    KILN_FIELD_(struct_size)                                                                \
    sizeof(kiln_norm_vtable), KILN_FIELD_(create)(create_), KILN_FIELD_(destroy)(destroy_), \
        KILN_FIELD_(forward)(forward_), KILN_FIELD_(backward)(backward_)                    \
  }
#define KILN_NORM_VTABLE_V1_SIZE KILN_SIZE_UP_TO(kiln_norm_vtable, backward)
#define KILN_NORM_LAYOUT_V1_0_SIZE KILN_SIZE_UP_TO(kiln_norm_layout, fused_activation)
#define KILN_NORM_BACKWARD_ARGS_V1_2_SIZE KILN_SIZE_UP_TO(kiln_norm_backward_args, stream)
#define KILN_NORM_FORWARD_ARGS_V1_4_SIZE KILN_SIZE_UP_TO(kiln_norm_forward_args, stream)
#define KILN_NORM_SETUP_V1_8_SIZE KILN_SIZE_UP_TO(kiln_norm_setup, activation_param)
#define KILN_NORM_FORWARD_ARGS_V1_5_SIZE KILN_SIZE_UP_TO(kiln_norm_forward_args, batch_stats)
#define KILN_NORM_BACKWARD_ARGS_V1_3_SIZE KILN_SIZE_UP_TO(kiln_norm_backward_args, grad_bias_result)
#define KILN_NORM_BACKWARD_ARGS_V1_11_SIZE KILN_SIZE_UP_TO(kiln_norm_backward_args, reserve)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_NORM_H_ */
