/* A correct plain-C optimizer "c_sgd": p -= lr * (g + wd * p) on float32 CPU tensors of any
 * strides, with no momentum (so no state). Proves a plugin needs no C++ and no LibTorch. */
#include <stdlib.h>

#include "kiln/optimizer.h"
#include "kiln/plugin.h"

typedef struct c_sgd {
  const kiln_host_api* host;
} c_sgd;

static kiln_status* c_sgd_create(const kiln_host_api* host, const kiln_options* options,
                                 void** out) {
  c_sgd* instance = (c_sgd*)malloc(sizeof *instance);
  if (instance == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "c_sgd: out of memory");
  instance->host = host;
  *out = instance;
  return NULL;
}

static void c_sgd_destroy(void* instance) { free(instance); }

static int is_cpu_f32(const DLTensor* t) {
  return t->device.device_type == kDLCPU && t->dtype.code == kDLFloat && t->dtype.bits == 32 &&
         t->dtype.lanes == 1;
}

/* Element offset of flat (row-major) index `k`; NULL strides mean compact row-major. */
static int64_t offset_of(const DLTensor* t, int64_t k) {
  int64_t offset = 0, d;
  if (t->strides == NULL) return k;
  for (d = t->ndim - 1; d >= 0; --d) {
    offset += (k % t->shape[d]) * t->strides[d];
    k /= t->shape[d];
  }
  return offset;
}

static kiln_status* c_sgd_step(void* instance, kiln_call_context* ctx,
                               const kiln_param_group* group) {
  const kiln_host_api* host = ((const c_sgd*)instance)->host;
  const float lr = (float)group->lr, wd = (float)group->weight_decay;
  size_t i;
  for (i = 0; i < group->count; ++i) {
    const DLTensor* p = &group->params[i];
    const DLTensor* g = &group->grads[i];
    float* pd = (float*)((char*)p->data + p->byte_offset);
    const float* gd = (const float*)((const char*)g->data + g->byte_offset);
    int64_t n = 1, k, d;
    if (!is_cpu_f32(p) || !is_cpu_f32(g)) {
      return host->make_status(KILN_ERR_UNSUPPORTED, "c_sgd: only float32 CPU tensors");
    }
    for (d = 0; d < p->ndim; ++d) n *= p->shape[d];
    for (k = 0; k < n; ++k) {
      float* pk = pd + offset_of(p, k);
      *pk -= lr * (gd[offset_of(g, k)] + wd * *pk);
    }
  }
  return NULL;
}

static const kiln_optimizer_vtable vtable = {sizeof vtable, c_sgd_create, c_sgd_destroy,
                                             c_sgd_step};
static const kiln_capabilities caps = {
    sizeof caps, KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32 | KILN_CAP_MULTI_TENSOR, 0, NULL};
static const kiln_component_descriptor component = {sizeof component,
                                                    KILN_COMPONENT_OPTIMIZER,
                                                    0,
                                                    "c_sgd",
                                                    {1, 0, 0},
                                                    "plain SGD without momentum, in C",
                                                    &caps,
                                                    0,
                                                    NULL,
                                                    &vtable};
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor = {sizeof descriptor,
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR,
                                                  "good-c-optimizer",
                                                  {1, 0, 0},
                                                  1,
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
