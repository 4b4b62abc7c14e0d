/*
 * adagrad — an out-of-tree optimizer in plain C99, built against the installed Kiln SDK alone
 * (no LibTorch, no Kiln sources): Adagrad as torch.optim.Adagrad computes it, on float32 CPU
 * tensors of any strides.
 *
 *   g   = grad + weight_decay * p            (L2 weight decay: the group's weight_decay)
 *   clr = lr / (1 + (step - 1) * lr_decay)   (lr and step: the group's; step counts from 1)
 *   sum = sum + g * g                        (state "sum"; starts at initial_accumulator_value)
 *   p   = p - clr * g / (sqrt(sum) + eps)
 *
 * `sum` lives in a host tensor (state_tensor), so checkpoints and resume keep it; the plugin
 * never writes a file. test_against_torch.py trains with it and with torch.optim.Adagrad.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/optimizer.h"
#include "kiln/plugin.h"

typedef struct adagrad {
  const kiln_host_api* host; /* valid for the life of the process */
  double lr_decay;
  double initial_accumulator_value;
  double eps;
} adagrad;

static kiln_status* create(const kiln_host_api* host, const kiln_options* options, void** out) {
  adagrad* a = (adagrad*)calloc(1, sizeof *a);
  if (a == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "adagrad: out of memory");
  a->host = host;
  /* Checked against the schema below before create is called: all three are >= 0. */
  a->lr_decay = kiln_options_float(options, "lr_decay", 0.0);
  a->initial_accumulator_value = kiln_options_float(options, "initial_accumulator_value", 0.0);
  a->eps = kiln_options_float(options, "eps", 1e-10);
  *out = a;
  return NULL;
}

static void destroy(void* instance) { free(instance); }

/* ---- walking a DLTensor ------------------------------------------------------------------- */

static int is_cpu_f32(const DLTensor* t) {
  return t->device.device_type == kDLCPU && t->dtype.code == kDLFloat && t->dtype.bits == 32 &&
         t->dtype.lanes == 1;
}

static int same_shape(const DLTensor* a, const DLTensor* b) {
  int32_t d;
  if (a->ndim != b->ndim) return 0;
  for (d = 0; d < a->ndim; ++d) {
    if (a->shape[d] != b->shape[d]) return 0;
  }
  return 1;
}

static int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  int32_t d;
  for (d = 0; d < t->ndim; ++d) n *= t->shape[d];
  return n;
}

/* The first element: `data` plus `byte_offset` (a view into a larger buffer has one). */
static float* first_element(const DLTensor* t) { return (float*)((char*)t->data + t->byte_offset); }

/* Where the k-th element in row-major order lies, in elements from the first. NULL strides mean
 * compact row-major; otherwise a view may be transposed, sliced or broadcast. */
static int64_t offset_of(const DLTensor* t, int64_t k) {
  int64_t offset = 0;
  int32_t d;
  if (t->strides == NULL) return k;
  for (d = t->ndim - 1; d >= 0; --d) {
    offset += (k % t->shape[d]) * t->strides[d];
    k /= t->shape[d];
  }
  return offset;
}

/* Compact row-major: element k is k elements from the first (size-1 dimensions may have any
 * stride). Parameters usually are; the fast loop below uses that. */
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

/* ---- the update ----------------------------------------------------------------------------- */

/* One step's scalars, each rounded to float once, as torch rounds a Python scalar for a float32
 * op (clr is formed in double first, as in Python). */
typedef struct coeffs {
  float weight_decay, minus_clr, eps;
} coeffs;

static void update(float* p, const float* grad, float* sum, const coeffs* c) {
  const float g = *grad + c->weight_decay * *p;
  *sum = *sum + g * g;
  *p = *p + c->minus_clr * g / (sqrtf(*sum) + c->eps);
}

/* A KILN_ERR_UNSUPPORTED status naming the tensor that is not float32 on the CPU. */
static kiln_status* refuse(const kiln_host_api* host, const char* what, const char* name) {
  char message[256];
  snprintf(message, sizeof message, "adagrad: %s of '%s' is not a float32 CPU tensor", what, name);
  return host->make_status(KILN_ERR_UNSUPPORTED, message);
}

/* The state "sum" of parameter i; created (filled with initial_accumulator_value) on first use. */
static kiln_status* sum_of(const adagrad* a, kiln_call_context* ctx, size_t i, const char* name,
                           DLTensor* sum) {
  int32_t created = 0;
  kiln_status* status =
      a->host->state_tensor(ctx, i, "sum", KILN_STATE_ZEROS_LIKE_PARAM, sum, &created);
  if (status != NULL) return status; /* the host's own message, passed back as it is */
  if (!is_cpu_f32(sum)) return refuse(a->host, "state 'sum'", name);
  if (created) {
    /* New tensors start at zero; torch starts the sum at initial_accumulator_value. A tensor
     * restored from a checkpoint comes back with created == 0 and keeps its values. */
    const float start = (float)a->initial_accumulator_value;
    float* s = first_element(sum);
    int64_t k;
    for (k = 0; k < numel(sum); ++k) s[offset_of(sum, k)] = start;
  }
  return NULL;
}

static kiln_status* step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const adagrad* a = (const adagrad*)instance;
  coeffs c;
  size_t i;
  c.weight_decay = (float)group->weight_decay;
  c.minus_clr = (float)(-group->lr / (1.0 + (double)(group->step - 1) * a->lr_decay));
  c.eps = (float)a->eps;

  /* First every check (and every state tensor), then the writes: a refused step leaves the
   * group as it was. */
  for (i = 0; i < group->count; ++i) {
    const char* name = group->names[i];
    DLTensor sum;
    kiln_status* status;
    if (!is_cpu_f32(&group->params[i])) return refuse(a->host, "the parameter", name);
    if (!is_cpu_f32(&group->grads[i])) return refuse(a->host, "the gradient", name);
    if (!same_shape(&group->params[i], &group->grads[i])) {
      return a->host->make_status(KILN_ERR_INVALID_ARGUMENT,
                                  "adagrad: a gradient's shape differs from its parameter's");
    }
    status = sum_of(a, ctx, i, name, &sum);
    if (status != NULL) return status;
  }

  for (i = 0; i < group->count; ++i) {
    const DLTensor* pt = &group->params[i];
    const DLTensor* gt = &group->grads[i];
    DLTensor st;
    float *p, *s;
    const float* g;
    int64_t k, n = numel(pt);
    kiln_status* status = sum_of(a, ctx, i, group->names[i], &st);
    if (status != NULL) return status;
    p = first_element(pt);
    g = first_element(gt);
    s = first_element(&st);
    if (is_compact(pt) && is_compact(gt) && is_compact(&st)) {
      for (k = 0; k < n; ++k) update(p + k, g + k, s + k, &c);
    } else {
      for (k = 0; k < n; ++k) {
        update(p + offset_of(pt, k), g + offset_of(gt, k), s + offset_of(&st, k), &c);
      }
    }
  }
  return NULL;
}

/* ---- what the host reads -------------------------------------------------------------------- */

static const kiln_optimizer_vtable vtable = KILN_OPTIMIZER_VTABLE_INIT(create, destroy, step);

/* The loops above read memory directly: CPU only, float32 only. The host refuses a pipeline on
 * another device or dtype before training starts, naming this optimizer. */
static const kiln_capabilities caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32);

/* name, type, has_min, has_max, reserved, min, max, default (TOML), choices, doc. The lr and
 * the weight decay are the host's ([optimizer] lr, weight_decay and the group rules): they
 * arrive per group in kiln_param_group. */
static const kiln_option_spec options[] = {
    KILN_OPTION_MIN_INIT("lr_decay", KILN_OPT_FLOAT, 0.0, "0.0",
                         "the step's lr is lr / (1 + (step - 1) * lr_decay)"),
    KILN_OPTION_MIN_INIT("initial_accumulator_value", KILN_OPT_FLOAT, 0.0, "0.0",
                         "starting value of the sum of squared gradients (state 'sum')"),
    KILN_OPTION_MIN_INIT("eps", KILN_OPT_FLOAT, 0.0, "1e-10",
                         "term added to the denominator for numerical stability")};

static const kiln_component_descriptor component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "c_adagrad", KILN_VERSION_INIT(1, 0, 0),
    "Adagrad as torch.optim.Adagrad, plain C, float32 CPU (an out-of-tree example)", &caps, options,
    &vtable);

static const kiln_component_descriptor* const components[] = {&component};

static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("example-adagrad", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
