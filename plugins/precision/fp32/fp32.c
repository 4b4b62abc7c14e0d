/*
 * kiln_fp32 — the "fp32" precision policy, plain C99: float32 everywhere, no autocast, no loss
 * scaling. It has no per-instance state; create hands back a static sentinel.
 */
#include "kiln/plugin.h"
#include "kiln/precision.h"

static int fp32_instance; /* non-NULL placeholder instance: the policy is stateless */

static kiln_status* fp32_create(const kiln_host_api* host, const kiln_options* options,
                                DLDevice device, void** out) {
  *out = &fp32_instance;
  return NULL;
}

static void fp32_destroy(void* instance) {}

static kiln_status* fp32_policy(void* instance, kiln_precision_policy* policy) {
  /* Fill only what the host's struct_size covers (its struct may be older than ours). */
  kiln_precision_policy p;
  size_t n = policy->struct_size < sizeof p ? policy->struct_size : sizeof p;
  size_t i;
  p.struct_size = policy->struct_size;
  p.model_dtype = KILN_DTYPE_F32;
  p.autocast = 0;
  p.compute_dtype = KILN_DTYPE_F32;
  p.master_weights = 0;
  p.norm_fp32 = 1;
  p.loss_scaling = KILN_SCALE_NONE;
  p.initial_scale = 1.0;
  for (i = sizeof p.struct_size; i < n; ++i) ((char*)policy)[i] = ((const char*)&p)[i];
  return NULL;
}

static const kiln_precision_vtable fp32_vtable = {sizeof(kiln_precision_vtable), fp32_create,
                                                  fp32_destroy, fp32_policy, NULL};

static const kiln_capabilities fp32_caps = {
    sizeof(kiln_capabilities), KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32, 0,
    NULL};

static const kiln_component_descriptor fp32_component = {
    sizeof(kiln_component_descriptor),
    KILN_COMPONENT_PRECISION,
    0,
    "fp32",
    {1, 0, 0},
    "float32 parameters and compute, no autocast, no loss scaling",
    &fp32_caps,
    0,
    NULL,
    &fp32_vtable};

static const kiln_component_descriptor* const components[] = {&fp32_component};

static const kiln_plugin_descriptor descriptor = {sizeof(kiln_plugin_descriptor),
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR,
                                                  "kiln-fp32",
                                                  {1, 0, 0},
                                                  1,
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
