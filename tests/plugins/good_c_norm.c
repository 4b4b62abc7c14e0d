/* A batch-norm layer in plain C99 that never sees LibTorch ("c_bn"): float32 on the CPU, any
 * strides, N x C x ... Its forward keeps the normalised input x̂ in a tensor it allocates and hands
 * to the host (ABI 1.11, kiln_norm_forward_args.reserve_result), so it asks the host to save
 * nothing (KILN_NORM_SAVE_NOTHING) and its backward reads x̂ from the reserve the host lends back:
 *   forward   y = x̂ w + b, x̂ = (x - mean) invstd (batch statistics in training, running ones in
 *             evaluation; running statistics updated as torch, with the unbiased variance)
 *   backward  dx = w invstd (dy - mean(dy) - x̂ mean(dy x̂)) in training, w invstd dy in evaluation;
 *             dw = Σ dy x̂, db = Σ dy.
 * c_bn_live_reserves() counts the reserves not yet released, for the tests. A host older than
 * 1.11 has no slot for the reserve: create refuses it.
 * With the option relu = true and a model asking for a ReLU, the layer applies the ReLU itself
 * and keeps no reserve: it asks the host to keep its input and its output (ABI 1.12,
 * KILN_NORM_SAVE_INPUT_AND_OUTPUT), and its backward recomputes x̂ from the input and the saved
 * statistics and takes the ReLU's mask from the output (kiln_norm_backward_args.saved_output). */
#include <math.h>
#include <stdlib.h>

#include "kiln/norm.h"
#include "kiln/plugin.h"

typedef struct c_bn {
  const kiln_host_api* host;
  int64_t channels;
  double momentum;
  double eps;
  int relu; /* applies the model's ReLU; input and output kept by the host */
} c_bn;

static int live_reserves = 0;

KILN_EXPORT int c_bn_live_reserves(void) { return live_reserves; }

static kiln_status* invalid(const kiln_host_api* host, const char* message) {
  return host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
}

/* Walks a float32 N x C x ... tensor: the address of element (n, c, s), s the flat index over the
 * trailing dimensions in row-major order. */
static float* at(const DLTensor* t, int64_t n, int64_t c, int64_t s) {
  int64_t offset = n * t->strides[0] + c * t->strides[1];
  int d;
  for (d = t->ndim - 1; d >= 2; --d) {
    offset += (s % t->shape[d]) * t->strides[d];
    s /= t->shape[d];
  }
  return (float*)((char*)t->data + t->byte_offset) + offset;
}

static float* vec(const DLTensor* t, int64_t c) {
  return (float*)((char*)t->data + t->byte_offset) + c * t->strides[0];
}

static int64_t spatial(const DLTensor* t) {
  int64_t s = 1;
  int d;
  for (d = 2; d < t->ndim; ++d) s *= t->shape[d];
  return s;
}

static int is_f32_cpu(const DLTensor* t) {
  return t->device.device_type == kDLCPU && t->dtype.code == kDLFloat && t->dtype.bits == 32 &&
         t->dtype.lanes == 1;
}

/* The reserve: x̂ as a dense float32 [N, C, S] the host keeps and releases through this deleter. */
typedef struct reserve {
  DLManagedTensor managed;
  int64_t shape[3];
  int64_t strides[3];
} reserve;

static void release_reserve(DLManagedTensor* self) {
  free(self->dl_tensor.data);
  free(self);
  --live_reserves;
}

static reserve* new_reserve(int64_t n, int64_t c, int64_t s) {
  reserve* r = (reserve*)calloc(1, sizeof *r);
  if (r == NULL) return NULL;
  r->managed.dl_tensor.data = malloc((size_t)(n * c * s > 0 ? n * c * s : 1) * sizeof(float));
  if (r->managed.dl_tensor.data == NULL) {
    free(r);
    return NULL;
  }
  r->shape[0] = n;
  r->shape[1] = c;
  r->shape[2] = s;
  r->strides[0] = c * s;
  r->strides[1] = s;
  r->strides[2] = 1;
  r->managed.dl_tensor.device.device_type = kDLCPU;
  r->managed.dl_tensor.ndim = 3;
  r->managed.dl_tensor.dtype.code = kDLFloat;
  r->managed.dl_tensor.dtype.bits = 32;
  r->managed.dl_tensor.dtype.lanes = 1;
  r->managed.dl_tensor.shape = r->shape;
  r->managed.dl_tensor.strides = r->strides;
  r->managed.deleter = &release_reserve;
  ++live_reserves;
  return r;
}

static kiln_status* bn_create(const kiln_host_api* host, const kiln_options* options,
                              const kiln_norm_setup* setup, kiln_norm_layout* layout, void** out) {
  c_bn* bn;
  if (host->abi_minor < 11) {
    return invalid(host,
                   "c_bn: keeps x-hat in the forward's reserve, which needs a host of ABI "
                   "1.11 or later");
  }
  if (setup->num_features <= 0) return invalid(host, "c_bn: num_features must be positive");
  bn = (c_bn*)malloc(sizeof *bn);
  if (bn == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "c_bn: out of memory");
  bn->host = host;
  bn->channels = setup->num_features;
  bn->momentum = kiln_options_float(options, "momentum", 0.1);
  bn->eps = kiln_options_float(options, "eps", 1e-5);
  bn->relu = kiln_options_bool(options, "relu", 0) != 0 && setup->activation == KILN_ACT_RELU;
  if (bn->relu && host->abi_minor < 12) {
    free(bn);
    return invalid(host,
                   "c_bn: relu = true has the host keep input and output, which needs a host of "
                   "ABI 1.12 or later");
  }
  layout->affine = 1;
  layout->running_stats = 1;
  layout->saves = bn->relu ? KILN_NORM_SAVE_INPUT_AND_OUTPUT : KILN_NORM_SAVE_NOTHING;
  layout->fused_activation = bn->relu;
  *out = bn;
  return NULL;
}

static void bn_destroy(void* instance) { free(instance); }

static kiln_status* bn_forward(void* instance, kiln_call_context* ctx,
                               const kiln_norm_forward_args* args) {
  const c_bn* bn = (const c_bn*)instance;
  const DLTensor* x = args->input;
  const int64_t n = x->shape[0], channels = x->shape[1], s = spatial(x);
  const double count = (double)(n * s);
  const int batch = args->training != 0 || args->running_mean == NULL;
  kiln_norm_batch_stats* report = NULL;
  reserve* r;
  int64_t c, i, j;
  (void)ctx;
  if (x->ndim < 2 || channels != bn->channels || !is_f32_cpu(x) || !is_f32_cpu(args->output)) {
    return invalid(bn->host, "c_bn: expects float32 CPU input of N x num_features x ...");
  }
  if (!bn->relu && (!KILN_HAS_FIELD(args, kiln_norm_forward_args, reserve_result) ||
                    args->reserve_result == NULL)) {
    return invalid(bn->host, "c_bn: the host gave no reserve_result slot");
  }
  if (args->training != 0 && KILN_HAS_FIELD(args, kiln_norm_forward_args, batch_stats)) {
    report = args->batch_stats;
  }
  r = bn->relu ? NULL : new_reserve(n, channels, s);
  if (!bn->relu && r == NULL) {
    return bn->host->make_status(KILN_ERR_OUT_OF_MEMORY, "c_bn: out of memory");
  }
  for (c = 0; c < channels; ++c) {
    double mean = 0.0, var = 0.0, invstd;
    const float w = args->weight != NULL ? *vec(args->weight, c) : 1.0F;
    const float b = args->bias != NULL ? *vec(args->bias, c) : 0.0F;
    float* xhat = r != NULL ? (float*)r->managed.dl_tensor.data : NULL;
    if (batch) {
      for (i = 0; i < n; ++i) {
        for (j = 0; j < s; ++j) mean += *at(x, i, c, j);
      }
      mean /= count;
      for (i = 0; i < n; ++i) {
        for (j = 0; j < s; ++j) {
          const double d = *at(x, i, c, j) - mean;
          var += d * d;
        }
      }
      var /= count; /* biased, for normalising */
    } else {
      mean = *vec(args->running_mean, c);
      var = *vec(args->running_var, c);
    }
    invstd = 1.0 / sqrt(var + bn->eps);
    for (i = 0; i < n; ++i) {
      for (j = 0; j < s; ++j) {
        const float h = (float)((*at(x, i, c, j) - mean) * invstd);
        const float out = h * w + b;
        if (xhat != NULL) xhat[(i * channels + c) * s + j] = h;
        *at(args->output, i, c, j) = bn->relu && out < 0.0F ? 0.0F : out;
      }
    }
    *vec(args->save_mean, c) = (float)mean;
    *vec(args->save_invstd, c) = (float)invstd;
    if (args->training != 0) {
      const double unbiased = count > 1.0 ? var * count / (count - 1.0) : var;
      if (report != NULL) {
        *vec(report->mean, c) = (float)mean;
        *vec(report->var, c) = (float)unbiased;
      } else if (args->running_mean != NULL) {
        float* rm = vec(args->running_mean, c);
        float* rv = vec(args->running_var, c);
        *rm = (float)(bn->momentum * mean + (1.0 - bn->momentum) * *rm);
        *rv = (float)(bn->momentum * unbiased + (1.0 - bn->momentum) * *rv);
      }
    }
  }
  if (report != NULL) {
    report->count = count;
    report->momentum = bn->momentum;
    report->reported = 1;
  }
  if (r != NULL) *args->reserve_result = &r->managed;
  return NULL;
}

/* x̂ at (i, c, j): from the reserve, or recomputed from the kept input and the saved statistics as
 * the forward computed it. */
static double xhat_at(const kiln_norm_backward_args* args, const float* reserve, int64_t i,
                      int64_t c, int64_t j, int64_t channels, int64_t s) {
  if (reserve != NULL) return reserve[(i * channels + c) * s + j];
  return (float)((*at(args->saved, i, c, j) - *vec(args->save_mean, c)) *
                 (double)*vec(args->save_invstd, c));
}

/* dy at (i, c, j), through the layer's ReLU where it applies one: zero where the output is. */
static double dy_at(const c_bn* bn, const kiln_norm_backward_args* args, int64_t i, int64_t c,
                    int64_t j) {
  if (bn->relu && *at(args->saved_output, i, c, j) <= 0.0F) return 0.0;
  return *at(args->grad_output, i, c, j);
}

static kiln_status* bn_backward(void* instance, kiln_call_context* ctx,
                                const kiln_norm_backward_args* args) {
  const c_bn* bn = (const c_bn*)instance;
  const DLTensor* dy = args->grad_output;
  const int64_t n = dy->shape[0], channels = dy->shape[1], s = spatial(dy);
  const double count = (double)(n * s);
  const float* xhat = NULL;
  int64_t c, i, j;
  (void)ctx;
  if (bn->relu) {
    if (!KILN_HAS_FIELD(args, kiln_norm_backward_args, saved_output) || args->saved == NULL ||
        args->saved_output == NULL || !is_f32_cpu(args->saved) || !is_f32_cpu(args->saved_output)) {
      return invalid(bn->host, "c_bn: backward was not lent the forward's input and output");
    }
  } else if (!KILN_HAS_FIELD(args, kiln_norm_backward_args, reserve) || args->reserve == NULL) {
    return invalid(bn->host, "c_bn: backward was lent no reserve");
  } else if (args->reserve->shape[0] * args->reserve->shape[1] * args->reserve->shape[2] !=
             n * channels * s) {
    return invalid(bn->host, "c_bn: the reserve lent back is not the forward's");
  } else {
    xhat = (const float*)args->reserve->data;
  }
  for (c = 0; c < channels; ++c) {
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    const double w = args->weight != NULL ? *vec(args->weight, c) : 1.0;
    const double scale = w * *vec(args->save_invstd, c);
    for (i = 0; i < n; ++i) {
      for (j = 0; j < s; ++j) {
        const double g = dy_at(bn, args, i, c, j);
        sum_dy += g;
        sum_dy_xhat += g * xhat_at(args, xhat, i, c, j, channels, s);
      }
    }
    if (args->grad_input != NULL) {
      for (i = 0; i < n; ++i) {
        for (j = 0; j < s; ++j) {
          double g = dy_at(bn, args, i, c, j);
          if (args->training != 0) {
            g -= (sum_dy + xhat_at(args, xhat, i, c, j, channels, s) * sum_dy_xhat) / count;
          }
          *at(args->grad_input, i, c, j) = (float)(scale * g);
        }
      }
    }
    if (args->grad_weight != NULL) *vec(args->grad_weight, c) = (float)sum_dy_xhat;
    if (args->grad_bias != NULL) *vec(args->grad_bias, c) = (float)sum_dy;
  }
  return NULL;
}

static const kiln_norm_vtable vtable =
    KILN_NORM_VTABLE_INIT(bn_create, bn_destroy, bn_forward, bn_backward);
static const kiln_option_spec options[] = {
    KILN_OPTION_RANGE_INIT("momentum", KILN_OPT_FLOAT, 0.0, 1.0, "0.1", "running-stat weight"),
    KILN_OPTION_MIN_INIT("eps", KILN_OPT_FLOAT, 0.0, "1e-5", "added to the variance"),
    KILN_OPTION_INIT("relu", KILN_OPT_BOOL, "false",
                     "apply the model's ReLU, the host keeping input and output (ABI 1.12)"),
};
static const kiln_capabilities caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32);
static const kiln_component_descriptor component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_NORM, "c_bn", KILN_VERSION_INIT(1, 0, 0),
    "batch norm in plain C, x-hat kept in the forward's reserve", &caps, options, &vtable);
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("good-c-norm", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
