/* kiln_lion — the "lion" optimizer (Chen et al. 2023, "Symbolic Discovery of Optimization
 * Algorithms"), with lion-pytorch's update order, written in plain C99 against the SDK headers
 * only: a third-party plugin needs neither C++ nor LibTorch.
 *
 *   c = beta1 * m + (1 - beta1) * g
 *   p = p * (1 - lr * wd) - lr * sign(c)
 *   m = beta2 * m + (1 - beta2) * g
 *
 * m is the host-owned state "exp_avg". float32 CPU tensors only, any strides and byte offset. */
#include <stdio.h>
#include <stdlib.h>

#include "kiln/optimizer.h"
#include "kiln/plugin.h"

typedef struct lion {
  const kiln_host_api* host;
  double beta1;
  double beta2;
} lion;

/* One step's scalars, rounded to float once as torch rounds a Python scalar for a float32 op
 * (1 - beta is formed in double first, as in Python). */
typedef struct lion_coeffs {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, decay, lr;
} lion_coeffs;

static kiln_status* lion_create(const kiln_host_api* host, const kiln_options* options,
                                void** out) {
  char message[160];
  lion* instance;
  const double beta1 = kiln_options_float(options, "beta1", 0.9);
  const double beta2 = kiln_options_float(options, "beta2", 0.99);
  /* The host validates against the schema; this guards hosts that do not. */
  if (!(beta1 >= 0.0 && beta1 <= 1.0) || !(beta2 >= 0.0 && beta2 <= 1.0)) {
    snprintf(message, sizeof message, "lion: beta1 and beta2 must be in [0, 1], got %g and %g",
             beta1, beta2);
    return host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
  }
  instance = (lion*)malloc(sizeof *instance);
  if (instance == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "lion: out of memory");
  instance->host = host;
  instance->beta1 = beta1;
  instance->beta2 = beta2;
  *out = instance;
  return NULL;
}

static void lion_destroy(void* instance) { free(instance); }

/* ---- checks ---------------------------------------------------------------------------------- */

static int is_cpu_f32(const DLTensor* t) {
  return t->device.device_type == kDLCPU && t->dtype.code == kDLFloat && t->dtype.bits == 32 &&
         t->dtype.lanes == 1;
}

static void describe_dtype(DLDataType d, char* out, size_t size) {
  const char* kind = d.code == kDLFloat    ? "float"
                     : d.code == kDLBfloat ? "bfloat"
                     : d.code == kDLInt    ? "int"
                     : d.code == kDLUInt   ? "uint"
                                           : "dtype-code-";
  if (d.code == kDLFloat || d.code == kDLBfloat || d.code == kDLInt || d.code == kDLUInt) {
    snprintf(out, size, "%s%u", kind, (unsigned)d.bits);
  } else {
    snprintf(out, size, "%s%u/%u bits", kind, (unsigned)d.code, (unsigned)d.bits);
  }
  if (d.lanes != 1) {
    size_t used = 0;
    while (used < size && out[used] != '\0') ++used;
    snprintf(out + used, size - used, "x%u", (unsigned)d.lanes);
  }
}

static void describe_device(DLDevice d, char* out, size_t size) {
  if (d.device_type == kDLCPU) {
    snprintf(out, size, "cpu");
  } else if (d.device_type == kDLCUDA) {
    snprintf(out, size, "cuda:%d", (int)d.device_id);
  } else {
    snprintf(out, size, "device type %d", (int)d.device_type);
  }
}

/* KILN_ERR_UNSUPPORTED naming `role` (e.g. "parameter", "gradient of parameter") and what it is. */
static kiln_status* refuse(const kiln_host_api* host, const char* role, const char* name,
                           size_t index, const DLTensor* t) {
  char dtype[48], device[48], message[320];
  describe_dtype(t->dtype, dtype, sizeof dtype);
  describe_device(t->device, device, sizeof device);
  snprintf(message, sizeof message,
           "lion: %s '%s' (index %zu) is %s on %s; lion supports float32 CPU tensors only", role,
           name, index, dtype, device);
  return host->make_status(KILN_ERR_UNSUPPORTED, message);
}

static int same_shape(const DLTensor* a, const DLTensor* b) {
  int32_t d;
  if (a->ndim != b->ndim) return 0;
  for (d = 0; d < a->ndim; ++d) {
    if (a->shape[d] != b->shape[d]) return 0;
  }
  return 1;
}

/* Compact row-major (size-1 dimensions may have any stride); NULL strides mean compact. */
static int is_compact(const DLTensor* t) {
  int64_t expected = 1;
  int32_t d;
  if (t->strides == NULL) return 1;
  for (d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expected) return 0;
    expected *= t->shape[d];
  }
  return 1;
}

static int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  int32_t d;
  for (d = 0; d < t->ndim; ++d) n *= t->shape[d];
  return n;
}

static float* data_of(const DLTensor* t) { return (float*)((char*)t->data + t->byte_offset); }

/* Element stride of dimension `d` (compact row-major when the view has no strides). */
static int64_t stride_of(const DLTensor* t, int32_t d) {
  int64_t s = 1;
  int32_t k;
  if (t->strides != NULL) return t->strides[d];
  for (k = t->ndim - 1; k > d; --k) s *= t->shape[k];
  return s;
}

/* ---- the update ---------------------------------------------------------------------------- */

/* sign(c) as torch.sign: 0 for 0, NaN for NaN (c itself in both cases). With -fno-trapping-math
 * GCC turns the selects into masks and vectorises the contiguous loop. */
static void update_run(float* restrict p, const float* restrict g, float* restrict m, int64_t n,
                       int64_t sp, int64_t sg, int64_t sm, const lion_coeffs* k) {
  const float b1 = k->beta1, omb1 = k->one_minus_beta1, b2 = k->beta2, omb2 = k->one_minus_beta2;
  const float decay = k->decay, lr = k->lr;
  int64_t i;
  if (sp == 1 && sg == 1 && sm == 1) {
    for (i = 0; i < n; ++i) {
      const float gi = g[i], mi = m[i];
      const float c = mi * b1 + omb1 * gi;
      const float s = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : c);
      p[i] = p[i] * decay - lr * s;
      m[i] = mi * b2 + omb2 * gi;
    }
    return;
  }
  for (i = 0; i < n; ++i) {
    const float gi = g[i * sg], mi = m[i * sm];
    const float c = mi * b1 + omb1 * gi;
    const float s = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : c);
    p[i * sp] = p[i * sp] * decay - lr * s;
    m[i * sm] = mi * b2 + omb2 * gi;
  }
}

/* Walks an N-d strided view: the innermost dimension as one run, the outer ones as an odometer.
 * Returns 0 when the index buffer cannot be allocated. */
static int update_strided(const DLTensor* pt, const DLTensor* gt, const DLTensor* mt,
                          const lion_coeffs* k) {
  const int32_t nd = pt->ndim, inner = nd - 1;
  int64_t* index;
  float *p = data_of(pt), *m = data_of(mt);
  const float* g = data_of(gt);
  int32_t d;
  if (nd == 0) {
    update_run(p, g, m, 1, 1, 1, 1, k);
    return 1;
  }
  index = (int64_t*)calloc((size_t)nd, sizeof *index);
  if (index == NULL) return 0;
  for (;;) {
    update_run(p, g, m, pt->shape[inner], stride_of(pt, inner), stride_of(gt, inner),
               stride_of(mt, inner), k);
    /* Advance the outer index, carrying; rewind each pointer as a dimension wraps. */
    for (d = inner - 1; d >= 0; --d) {
      p += stride_of(pt, d);
      g += stride_of(gt, d);
      m += stride_of(mt, d);
      if (++index[d] < pt->shape[d]) break;
      p -= stride_of(pt, d) * pt->shape[d];
      g -= stride_of(gt, d) * gt->shape[d];
      m -= stride_of(mt, d) * mt->shape[d];
      index[d] = 0;
    }
    if (d < 0) break;
  }
  free(index);
  return 1;
}

static kiln_status* lion_step(void* instance, kiln_call_context* ctx,
                              const kiln_param_group* group) {
  const lion* self = (const lion*)instance;
  const kiln_host_api* host = self->host;
  lion_coeffs k;
  size_t i;
  k.beta1 = (float)self->beta1;
  k.one_minus_beta1 = (float)(1.0 - self->beta1);
  k.beta2 = (float)self->beta2;
  k.one_minus_beta2 = (float)(1.0 - self->beta2);
  k.decay = (float)(1.0 - group->lr * group->weight_decay);
  k.lr = (float)group->lr;

  /* Everything is checked before anything is written, so a refused step leaves the group as it
   * was. */
  for (i = 0; i < group->count; ++i) {
    const DLTensor* p = &group->params[i];
    const DLTensor* g = &group->grads[i];
    const char* name = group->names != NULL ? group->names[i] : "?";
    if (!is_cpu_f32(p)) return refuse(host, "parameter", name, i, p);
    if (!is_cpu_f32(g)) return refuse(host, "gradient of parameter", name, i, g);
    if (!same_shape(p, g)) {
      char message[256];
      snprintf(message, sizeof message,
               "lion: gradient of parameter '%s' (index %zu) has another shape than the "
               "parameter",
               name, i);
      return host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
    }
  }

  for (i = 0; i < group->count; ++i) {
    const DLTensor* p = &group->params[i];
    const DLTensor* g = &group->grads[i];
    const char* name = group->names != NULL ? group->names[i] : "?";
    DLTensor m;
    kiln_status* status =
        host->state_tensor(ctx, i, "exp_avg", KILN_STATE_ZEROS_LIKE_PARAM, &m, NULL);
    if (status != NULL) return status; /* the host's own message, passed back unchanged */
    if (!is_cpu_f32(&m)) return refuse(host, "state exp_avg of parameter", name, i, &m);
    if (!same_shape(p, &m)) {
      return host->make_status(KILN_ERR_INTERNAL, "lion: the host's exp_avg has another shape");
    }
    if (is_compact(p) && is_compact(g) && is_compact(&m)) {
      update_run(data_of(p), data_of(g), data_of(&m), numel(p), 1, 1, 1, &k);
    } else if (numel(p) > 0 && !update_strided(p, g, &m, &k)) {
      return host->make_status(KILN_ERR_OUT_OF_MEMORY, "lion: out of memory");
    }
  }
  return NULL;
}

/* ---- descriptors ----------------------------------------------------------------------------- */

static const kiln_optimizer_vtable vtable =
    KILN_OPTIMIZER_VTABLE_INIT(lion_create, lion_destroy, lion_step);

static const kiln_option_spec options[] = {
    KILN_OPTION_RANGE_INIT(
        "beta1", KILN_OPT_FLOAT, 0.0, 1.0, "0.9",
        "interpolation factor between momentum and gradient for the update's sign"),
    KILN_OPTION_RANGE_INIT("beta2", KILN_OPT_FLOAT, 0.0, 1.0, "0.99",
                           "decay rate of the momentum (exp_avg)"),
};

static const kiln_capabilities caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32);

static const kiln_component_descriptor component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "lion", KILN_VERSION_INIT(1, 0, 0),
    "Lion (sign of interpolated momentum, decoupled weight decay), plain C, float32 CPU", &caps,
    options, &vtable);

static const kiln_component_descriptor* const components[] = {&component};

static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-lion", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
