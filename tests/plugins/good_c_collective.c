/* A plain-C optimizer "c_sum_sgd" that uses the host's collectives: each gradient is copied,
 * summed over the ranks with kiln_host_api.allreduce, and applied as p -= lr * sum. Under DDP
 * (gradients already averaged) that is world_size times c_sgd's step; in one process, c_sgd's.
 * Proves a plain-C plugin reaches the run's process group (rank, world_size, allreduce). */
#include <stdlib.h>
#include <string.h>

#include "kiln/optimizer.h"
#include "kiln/plugin.h"

typedef struct c_sum_sgd {
  const kiln_host_api* host;
} c_sum_sgd;

static kiln_status* create(const kiln_host_api* host, const kiln_options* options, void** out) {
  c_sum_sgd* instance = (c_sum_sgd*)malloc(sizeof *instance);
  (void)options;
  if (instance == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "c_sum_sgd: no memory");
  instance->host = host;
  *out = instance;
  return NULL;
}

static void destroy(void* instance) { free(instance); }

/* Float32 CPU tensors in compact row-major order only (the host hands the test's MLP such
 * views, with or without explicit strides). */
static int is_plain(const DLTensor* t) {
  int64_t expected = 1;
  int d;
  if (t->device.device_type != kDLCPU || t->dtype.code != kDLFloat || t->dtype.bits != 32 ||
      t->dtype.lanes != 1) {
    return 0;
  }
  if (t->strides == NULL) return 1;
  for (d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expected) return 0;
    expected *= t->shape[d];
  }
  return 1;
}

static kiln_status* step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const kiln_host_api* host = ((const c_sum_sgd*)instance)->host;
  const float lr = (float)group->lr;
  size_t i;
  if (host->rank(ctx) < 0 || host->rank(ctx) >= host->world_size(ctx)) {
    return host->make_status(KILN_ERR_INTERNAL, "c_sum_sgd: rank outside the world");
  }
  for (i = 0; i < group->count; ++i) {
    const DLTensor* p = &group->params[i];
    const DLTensor* g = &group->grads[i];
    float* pd = (float*)((char*)p->data + p->byte_offset);
    int64_t n = 1, k, d;
    float* sum;
    DLTensor view;
    kiln_status* status;
    if (!is_plain(p) || !is_plain(g)) {
      return host->make_status(KILN_ERR_UNSUPPORTED, "c_sum_sgd: only compact float32 CPU");
    }
    for (d = 0; d < p->ndim; ++d) n *= p->shape[d];
    /* The gradient is read-only: reduce a copy. */
    sum = (float*)malloc((size_t)n * sizeof *sum);
    if (sum == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "c_sum_sgd: no memory");
    memcpy(sum, (const char*)g->data + g->byte_offset, (size_t)n * sizeof *sum);
    view = *g;
    view.data = sum;
    view.byte_offset = 0;
    status = host->allreduce(ctx, &view, KILN_REDUCE_SUM);
    if (status != NULL) {
      free(sum);
      return status;
    }
    for (k = 0; k < n; ++k) pd[k] -= lr * sum[k];
    free(sum);
  }
  return NULL;
}

static const kiln_optimizer_vtable vtable = KILN_OPTIMIZER_VTABLE_INIT(create, destroy, step);
static const kiln_capabilities caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32 | KILN_CAP_MULTI_TENSOR);
static const kiln_component_descriptor component =
    KILN_COMPONENT_INIT(KILN_COMPONENT_OPTIMIZER, "c_sum_sgd", KILN_VERSION_INIT(1, 0, 0),
                        "SGD on gradients summed over the ranks, in C", &caps, &vtable);
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("good-c-collective", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
