/*
 * sgd_schedulefree — an optimizer with evaluation weights (ABI 1.14) in plain C99, built against
 * the installed Kiln SDK alone: Schedule-Free SGD as schedulefree.SGDScheduleFree (1.4.1)
 * computes it, on float32 CPU tensors of any strides.
 *
 * The model holds y, where the gradients are taken; z takes plain SGD steps; x, an average of
 * the z's, is what evaluation and `kiln export` should see. With k = step - 1:
 *
 *   lr_k       = lr * min(1, (k + 1) / warmup_steps)        (the package's own warm-up)
 *   lr_max     = max(lr_max, lr_k)
 *   weight     = (k + 1)^r * lr_max^weight_lr_power,  weight_sum = weight_sum + weight
 *   c          = weight / weight_sum                        (0 while weight_sum is 0)
 *   d          = grad + weight_decay * y
 *   y          = lerp(y, z, c) + lr_k * (momentum * (1 - c) - 1) * d
 *   z          = z - lr_k * d
 *   x          = y + (1 - 1/momentum) * (z - y)             (eval_weights)
 *
 * State, all in host tensors so checkpoints and resume keep it: "z" per parameter (it starts at
 * the weights), and the group's lr_max and weight_sum, float64 scalars kept with the group's
 * first parameter (state tensors belong to parameters). test_against_torch.py trains with it and
 * with schedulefree.SGDScheduleFree, and evaluates both at x.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/optimizer.h"
#include "kiln/plugin.h"

typedef struct sgd_schedulefree {
  const kiln_host_api* host; /* valid for the life of the process */
  double momentum;
  int64_t warmup_steps;
  double r;
  double weight_lr_power;
} sgd_schedulefree;

static kiln_status* create(const kiln_host_api* host, const kiln_options* options, void** out) {
  sgd_schedulefree* o;
  const double momentum = kiln_options_float(options, "momentum", 0.9);
  /* The schema allows [0, 1]; the ends make no sense here (x = y + (1 - 1/momentum)(z - y)). */
  if (!(momentum > 0.0 && momentum < 1.0)) {
    return host->make_status(KILN_ERR_INVALID_ARGUMENT,
                             "c_sgd_schedulefree: momentum must lie strictly between 0 and 1");
  }
  o = (sgd_schedulefree*)calloc(1, sizeof *o);
  if (o == NULL) {
    return host->make_status(KILN_ERR_OUT_OF_MEMORY, "c_sgd_schedulefree: out of memory");
  }
  o->host = host;
  o->momentum = momentum;
  o->warmup_steps = kiln_options_int(options, "warmup_steps", 0);
  o->r = kiln_options_float(options, "r", 0.0);
  o->weight_lr_power = kiln_options_float(options, "weight_lr_power", 2.0);
  *out = o;
  return NULL;
}

static void destroy(void* instance) { free(instance); }

/* ---- walking a DLTensor (as examples/optimizer_c/adagrad.c) ------------------------------- */

static int is_cpu(const DLTensor* t, int bits) {
  return t->device.device_type == kDLCPU && t->dtype.code == kDLFloat && t->dtype.bits == bits &&
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

static void* first_element(const DLTensor* t) { return (char*)t->data + t->byte_offset; }

/* Where the k-th element in row-major order lies, in elements from the first. */
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

/* A KILN_ERR_UNSUPPORTED status naming the tensor that is not float32 on the CPU. */
static kiln_status* refuse(const kiln_host_api* host, const char* what, const char* name) {
  char message[256];
  snprintf(message, sizeof message, "c_sgd_schedulefree: %s of '%s' is not a float32 CPU tensor",
           what, name);
  return host->make_status(KILN_ERR_UNSUPPORTED, message);
}

/* ---- state ---------------------------------------------------------------------------------- */

/* The state "z" of parameter i. A new one starts at the weights, as the package's
 * torch.clone(p); a restored one comes back with created == 0 and keeps its values. */
static kiln_status* z_of(const sgd_schedulefree* o, kiln_call_context* ctx,
                         const kiln_param_group* group, size_t i, DLTensor* z) {
  int32_t created = 0;
  const DLTensor* y = &group->params[i];
  kiln_status* status =
      o->host->state_tensor(ctx, i, "z", KILN_STATE_ZEROS_LIKE_PARAM, z, &created);
  if (status != NULL) return status;
  if (!is_cpu(z, 32)) return refuse(o->host, "state 'z'", group->names[i]);
  if (created) {
    const float* yp = (const float*)first_element(y);
    float* zp = (float*)first_element(z);
    int64_t k;
    for (k = 0; k < numel(y); ++k) zp[offset_of(z, k)] = yp[offset_of(y, k)];
  }
  return NULL;
}

/* The group's running lr_max and weight_sum: 0-dim float64 host tensors of its first parameter,
 * zero when new (the package starts lr_max at -1; any lr >= 0 replaces either). */
static kiln_status* group_scalar(const sgd_schedulefree* o, kiln_call_context* ctx,
                                 const char* name, double** out) {
  DLTensor t;
  kiln_status* status = o->host->state_tensor(ctx, 0, name, KILN_STATE_SCALAR_F64, &t, NULL);
  if (status != NULL) return status;
  if (!is_cpu(&t, 64) || t.ndim != 0) {
    return o->host->make_status(KILN_ERR_INTERNAL,
                                "c_sgd_schedulefree: a group scalar is not a 0-dim float64");
  }
  *out = (double*)first_element(&t);
  return NULL;
}

/* ---- the update ----------------------------------------------------------------------------- */

/* torch.lerp's float32 formula: from the nearer end, so weight 1 gives `end` exactly. */
static float lerp(float start, float end, float weight) {
  return fabsf(weight) < 0.5f ? start + weight * (end - start)
                              : end - (end - start) * (1.0f - weight);
}

/* One step's scalars, formed in double as in Python, each rounded to float once. */
typedef struct coeffs {
  float weight_decay, ckp1, y_step, lr;
} coeffs;

static void update(float* y, const float* grad, float* z, const coeffs* c) {
  const float d = *grad + c->weight_decay * *y;
  *y = lerp(*y, *z, c->ckp1);
  *y = *y + c->y_step * d;
  *z = *z - c->lr * d;
}

/* The package's per-group bookkeeping for step k (0-based), advancing lr_max and weight_sum. */
static coeffs coefficients(const sgd_schedulefree* o, const kiln_param_group* group, double* lr_max,
                           double* weight_sum) {
  const int64_t k = group->step - 1;
  const double sched = k < o->warmup_steps ? (double)(k + 1) / (double)o->warmup_steps : 1.0;
  const double lr = group->lr * sched;
  double weight, ckp1;
  coeffs c;
  if (lr > *lr_max) *lr_max = lr;
  weight = pow((double)(k + 1), o->r) * pow(*lr_max, o->weight_lr_power);
  *weight_sum += weight;
  ckp1 = *weight_sum != 0.0 ? weight / *weight_sum : 0.0;
  c.weight_decay = (float)group->weight_decay;
  c.ckp1 = (float)ckp1;
  c.y_step = (float)(lr * (o->momentum * (1.0 - ckp1) - 1.0));
  c.lr = (float)lr;
  return c;
}

static kiln_status* step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const sgd_schedulefree* o = (const sgd_schedulefree*)instance;
  double *lr_max, *weight_sum;
  kiln_status* status;
  coeffs c;
  size_t i;
  if (group->count == 0) return NULL;

  /* Every check and every state tensor first: a refused step changes no weight. */
  for (i = 0; i < group->count; ++i) {
    DLTensor z;
    if (!is_cpu(&group->params[i], 32)) return refuse(o->host, "the parameter", group->names[i]);
    if (!is_cpu(&group->grads[i], 32)) return refuse(o->host, "the gradient", group->names[i]);
    if (!same_shape(&group->params[i], &group->grads[i])) {
      return o->host->make_status(KILN_ERR_INVALID_ARGUMENT,
                                  "c_sgd_schedulefree: a gradient's "
                                  "shape differs from its parameter's");
    }
    status = z_of(o, ctx, group, i, &z);
    if (status != NULL) return status;
  }
  status = group_scalar(o, ctx, "lr_max", &lr_max);
  if (status == NULL) status = group_scalar(o, ctx, "weight_sum", &weight_sum);
  if (status != NULL) return status;
  c = coefficients(o, group, lr_max, weight_sum);

  for (i = 0; i < group->count; ++i) {
    const DLTensor* yt = &group->params[i];
    const DLTensor* gt = &group->grads[i];
    DLTensor zt;
    float *y, *z;
    const float* g;
    int64_t k, n = numel(yt);
    status = z_of(o, ctx, group, i, &zt);
    if (status != NULL) return status;
    y = (float*)first_element(yt);
    g = (const float*)first_element(gt);
    z = (float*)first_element(&zt);
    for (k = 0; k < n; ++k) {
      update(y + offset_of(yt, k), g + offset_of(gt, k), z + offset_of(&zt, k), &c);
    }
  }
  return NULL;
}

/* x = lerp(y, z, 1 - 1/momentum), written into the host's tensors `out`; y and z stay as they
 * are, so training goes on from exactly the same y after an evaluation. */
static kiln_status* eval_weights(void* instance, kiln_call_context* ctx,
                                 const kiln_param_group* group, const DLTensor* out) {
  const sgd_schedulefree* o = (const sgd_schedulefree*)instance;
  const float weight = (float)(1.0 - 1.0 / o->momentum);
  size_t i;
  for (i = 0; i < group->count; ++i) {
    const DLTensor* yt = &group->params[i];
    const DLTensor* xt = &out[i];
    DLTensor zt;
    const float *y, *z;
    float* x;
    int64_t k, n = numel(yt);
    kiln_status* status;
    if (!is_cpu(yt, 32)) return refuse(o->host, "the parameter", group->names[i]);
    if (!is_cpu(xt, 32) || !same_shape(yt, xt)) {
      return refuse(o->host, "the evaluation output", group->names[i]);
    }
    /* Never stepped: z is created equal to y, and x = y. */
    status = z_of(o, ctx, group, i, &zt);
    if (status != NULL) return status;
    y = (const float*)first_element(yt);
    z = (const float*)first_element(&zt);
    x = (float*)first_element(xt);
    for (k = 0; k < n; ++k) {
      x[offset_of(xt, k)] = lerp(y[offset_of(yt, k)], z[offset_of(&zt, k)], weight);
    }
  }
  return NULL;
}

/* ---- what the host reads -------------------------------------------------------------------- */

/* create, destroy, step, eval_weights, step_all (none: one call per group). */
static const kiln_optimizer_vtable vtable =
    KILN_OPTIMIZER_VTABLE_FULL_INIT(create, destroy, step, eval_weights, NULL);

static const kiln_capabilities caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32);

/* The package's options and defaults; lr and weight_decay are the host's. Its warm-up is its
 * own: leave [lr_policy] at "constant" without warmup, as the package expects no schedule. */
static const kiln_option_spec options[] = {
    KILN_OPTION_RANGE_INIT(
        "momentum", KILN_OPT_FLOAT, 0.0, 1.0, "0.9",
        "interpolation between y and z, in (0, 1); x = y + (1 - 1/momentum)(z - y)"),
    KILN_OPTION_MIN_INIT("warmup_steps", KILN_OPT_INT, 0.0, "0",
                         "linear warm-up of the lr over this many steps (the package's own)"),
    KILN_OPTION_INIT("r", KILN_OPT_FLOAT, "0.0",
                     "the weight of step k in the average grows as (k + 1)^r"),
    KILN_OPTION_INIT("weight_lr_power", KILN_OPT_FLOAT, "2.0",
                     "the weight of a step in the average grows as lr_max^weight_lr_power")};

static const kiln_component_descriptor component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "c_sgd_schedulefree", KILN_VERSION_INIT(1, 0, 0),
    "Schedule-Free SGD as schedulefree.SGDScheduleFree, plain C, float32 CPU (evaluates at x; an "
    "out-of-tree example)",
    &caps, options, &vtable);

static const kiln_component_descriptor* const components[] = {&component};

static const kiln_plugin_descriptor descriptor = KILN_PLUGIN_DESCRIPTOR_INIT(
    "example-sgd-schedulefree", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
