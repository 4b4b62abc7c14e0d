/*
 * sam — a wrapper optimizer that takes the whole step (ABI 1.14) in plain C99, built against the
 * installed Kiln SDK alone: sharpness-aware minimisation as pytorch_optimizer.SAM (4.1.0)
 * computes it, on float32 CPU tensors of any strides, around any optimizer.
 *
 *   n = sqrt(sum of grad * grad over every parameter of every group)
 *   w = w + rho * grad / (n + 1e-12)           (the ascent; the old w kept aside)
 *   the loss and gradients again at those w    (host->reevaluate: torch.optim's closure)
 *   w = the old w
 *   the inner optimizer steps w with the new gradients (host->inner_step)
 *
 * The inner optimizer is the pipeline's [optimizer.inner] (Kiln's sgd, a third party's, ...);
 * the host keeps its state and checkpoints it as "inner.<slot>". SAM keeps no state between
 * steps. test_against_torch.py trains it over sgd and compares with pytorch_optimizer.SAM.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/optimizer.h"
#include "kiln/plugin.h"

typedef struct sam {
  const kiln_host_api* host; /* valid for the life of the process */
  double rho;
} sam;

static kiln_status* create(const kiln_host_api* host, const kiln_options* options, void** out) {
  sam* s;
  /* reevaluate and inner_step came with ABI 1.14; an older host has neither. */
  if (!KILN_HAS_FIELD(host, kiln_host_api, inner_step)) {
    return host->make_status(KILN_ERR_UNSUPPORTED,
                             "c_sam: the host is older than Kiln ABI 1.14 "
                             "(it cannot evaluate the model again)");
  }
  s = (sam*)calloc(1, sizeof *s);
  if (s == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "c_sam: out of memory");
  s->host = host;
  s->rho = kiln_options_float(options, "rho", 0.05);
  *out = s;
  return NULL;
}

static void destroy(void* instance) { free(instance); }

/* ---- walking a DLTensor (as examples/optimizer_c/adagrad.c) ------------------------------- */

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

static float* first_element(const DLTensor* t) { return (float*)((char*)t->data + t->byte_offset); }

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

/* Every parameter and gradient float32 on the CPU and shaped alike; the elements of all. */
static kiln_status* check(const sam* s, const kiln_optimizer_step_args* args, int64_t* total) {
  size_t g, i;
  *total = 0;
  for (g = 0; g < args->group_count; ++g) {
    const kiln_param_group* group = &args->groups[g];
    for (i = 0; i < group->count; ++i) {
      char message[256];
      if (!is_cpu_f32(&group->params[i]) || !is_cpu_f32(&group->grads[i])) {
        snprintf(message, sizeof message, "c_sam: '%s' is not a float32 CPU tensor",
                 group->names[i]);
        return s->host->make_status(KILN_ERR_UNSUPPORTED, message);
      }
      if (!same_shape(&group->params[i], &group->grads[i])) {
        snprintf(message, sizeof message, "c_sam: the gradient of '%s' differs in shape",
                 group->names[i]);
        return s->host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
      }
      *total += numel(&group->params[i]);
    }
  }
  return NULL;
}

/* ---- the step ------------------------------------------------------------------------------- */

/* The global gradient norm, over every group (summed in double). */
static double grad_norm(const kiln_optimizer_step_args* args) {
  double sum = 0.0;
  size_t g, i;
  for (g = 0; g < args->group_count; ++g) {
    const kiln_param_group* group = &args->groups[g];
    for (i = 0; i < group->count; ++i) {
      const DLTensor* gt = &group->grads[i];
      const float* grad = first_element(gt);
      int64_t k, n = numel(gt);
      for (k = 0; k < n; ++k) {
        const double v = grad[offset_of(gt, k)];
        sum += v * v;
      }
    }
  }
  return sqrt(sum);
}

/* Saves every weight into `saved` (in order) and moves it by scale * grad. */
static void ascend(const kiln_optimizer_step_args* args, float scale, float* saved) {
  size_t g, i;
  for (g = 0; g < args->group_count; ++g) {
    const kiln_param_group* group = &args->groups[g];
    for (i = 0; i < group->count; ++i) {
      const DLTensor* pt = &group->params[i];
      const DLTensor* gt = &group->grads[i];
      float* p = first_element(pt);
      const float* grad = first_element(gt);
      int64_t k, n = numel(pt);
      for (k = 0; k < n; ++k) {
        float* w = p + offset_of(pt, k);
        *saved++ = *w;
        *w = *w + grad[offset_of(gt, k)] * scale;
      }
    }
  }
}

/* Puts back the weights `ascend` saved. */
static void restore(const kiln_optimizer_step_args* args, const float* saved) {
  size_t g, i;
  for (g = 0; g < args->group_count; ++g) {
    const kiln_param_group* group = &args->groups[g];
    for (i = 0; i < group->count; ++i) {
      const DLTensor* pt = &group->params[i];
      float* p = first_element(pt);
      int64_t k, n = numel(pt);
      for (k = 0; k < n; ++k) p[offset_of(pt, k)] = *saved++;
    }
  }
}

/* One call per optimizer step for all of this optimizer's groups: `step` is NULL. */
static kiln_status* step_all(void* instance, const kiln_optimizer_step_args* args) {
  const sam* s = (const sam*)instance;
  kiln_reevaluation r;
  kiln_status* status;
  float* saved;
  int64_t total;
  size_t g;

  status = check(s, args, &total);
  if (status != NULL) return status;
  /* The old weights, for the way back: memory of this call only. */
  saved = (float*)malloc((size_t)(total > 0 ? total : 1) * sizeof *saved);
  if (saved == NULL) return s->host->make_status(KILN_ERR_OUT_OF_MEMORY, "c_sam: out of memory");

  /* Up the gradient to w + rho g / (|g| + 1e-12); the scale rounded to float, as torch's is. */
  ascend(args, (float)(s->rho / (grad_norm(args) + 1e-12)), saved);

  /* The closure: forward and backward again at these weights, over the step's micro-batches.
   * The new gradients land in the same `grads` memory; `r` says whether they are finite. */
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  status = s->host->reevaluate(args->ctx, &r);

  /* Back to w, whatever happened: a failed or non-finite step leaves the weights as they were. */
  restore(args, saved);
  free(saved);
  if (status != NULL) return status;
  if (!r.finite) return NULL;

  /* The inner optimizer's update at w with the gradients from w + e(w), group by group. */
  for (g = 0; g < args->group_count; ++g) {
    status = s->host->inner_step(args->group_contexts[g], &args->groups[g]);
    if (status != NULL) return status;
  }
  return NULL;
}

/* ---- what the host reads -------------------------------------------------------------------- */

/* create, destroy, step (none: step_all takes the whole step), eval_weights, step_all. */
static const kiln_optimizer_vtable vtable =
    KILN_OPTIMIZER_VTABLE_FULL_INIT(create, destroy, NULL, NULL, step_all);

/* KILN_CAP_WRAPS_OPTIMIZER: the pipeline must name an [optimizer.inner], and inner_step steps
 * it. The loops read memory directly: CPU and float32 only. */
static const kiln_capabilities caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32 | KILN_CAP_WRAPS_OPTIMIZER);

/* lr, weight_decay and the inner optimizer's own options (momentum, ...) reach the inner
 * optimizer; SAM has only its radius. */
static const kiln_option_spec options[] = {KILN_OPTION_MIN_INIT(
    "rho", KILN_OPT_FLOAT, 0.0, "0.05", "radius of the ascent step: e = rho g / (|g| + 1e-12)")};

static const kiln_component_descriptor component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "c_sam", KILN_VERSION_INIT(1, 0, 0),
    "SAM as pytorch_optimizer.SAM around [optimizer.inner], plain C, float32 CPU (an out-of-tree "
    "example)",
    &caps, options, &vtable);

static const kiln_component_descriptor* const components[] = {&component};

static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("example-sam", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
