/* A third party's precision policy in plain C, "c_aimd": bf16 autocast with its own loss-scale
 * rule — additive increase (+1 per clean step), multiplicative decrease (/4 on overflow), never
 * below 1. Proves the scale rule is the plugin's: the host only calls update_scale. */
#include <stdlib.h>

#include "kiln/plugin.h"
#include "kiln/precision.h"

typedef struct aimd {
  double min_scale;
} aimd;

static kiln_status* aimd_create(const kiln_host_api* host, const kiln_options* options,
                                DLDevice device, void** out) {
  aimd* instance = (aimd*)malloc(sizeof *instance);
  (void)options;
  (void)device;
  if (instance == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "c_aimd: out of memory");
  instance->min_scale = 1.0;
  *out = instance;
  return NULL;
}

static void aimd_destroy(void* instance) { free(instance); }

static kiln_status* aimd_policy(void* instance, kiln_precision_policy* policy) {
  /* Written field by field, each only when the host's struct has it. */
  if (KILN_HAS_FIELD(policy, kiln_precision_policy, model_dtype)) {
    policy->model_dtype = KILN_DTYPE_F32;
  }
  if (KILN_HAS_FIELD(policy, kiln_precision_policy, autocast)) policy->autocast = 1;
  if (KILN_HAS_FIELD(policy, kiln_precision_policy, compute_dtype)) {
    policy->compute_dtype = KILN_DTYPE_BF16;
  }
  if (KILN_HAS_FIELD(policy, kiln_precision_policy, master_weights)) policy->master_weights = 0;
  if (KILN_HAS_FIELD(policy, kiln_precision_policy, norm_fp32)) policy->norm_fp32 = 1;
  if (KILN_HAS_FIELD(policy, kiln_precision_policy, loss_scaling)) {
    policy->loss_scaling = KILN_SCALE_DYNAMIC;
  }
  if (KILN_HAS_FIELD(policy, kiln_precision_policy, initial_scale)) policy->initial_scale = 1024.0;
  if (KILN_HAS_FIELD(policy, kiln_precision_policy, min_scale)) {
    policy->min_scale = ((const aimd*)instance)->min_scale;
  }
  if (KILN_HAS_FIELD(policy, kiln_precision_policy, at_min_scale)) {
    policy->at_min_scale = KILN_AT_MIN_SCALE_SKIP;
  }
  return NULL;
}

static kiln_status* aimd_update(void* instance, int32_t grads_finite, double* scale) {
  const double min_scale = ((const aimd*)instance)->min_scale;
  if (grads_finite) {
    *scale += 1.0;
  } else {
    *scale = *scale / 4.0 < min_scale ? min_scale : *scale / 4.0;
  }
  return NULL;
}

static const kiln_precision_vtable aimd_vtable = {
    sizeof(kiln_precision_vtable), aimd_create, aimd_destroy, aimd_policy, aimd_update, NULL, NULL};

static const kiln_capabilities aimd_caps = {
    sizeof(kiln_capabilities),
    KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32 | KILN_CAP_DTYPE_BF16, 0, NULL};

static const kiln_component_descriptor aimd_component = {
    sizeof(kiln_component_descriptor),
    KILN_COMPONENT_PRECISION,
    0,
    "c_aimd",
    {1, 0, 0},
    "test: bf16 autocast with an additive-increase, multiplicative-decrease loss scale",
    &aimd_caps,
    0,
    NULL,
    &aimd_vtable};

static const kiln_component_descriptor* const components[] = {&aimd_component};

static const kiln_plugin_descriptor descriptor = {sizeof(kiln_plugin_descriptor),
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR,
                                                  "kiln-test-c-aimd",
                                                  {1, 0, 0},
                                                  1,
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
