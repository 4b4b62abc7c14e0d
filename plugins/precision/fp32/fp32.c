/*
 * kiln_fp32 — the "fp32" precision policy, plain C99: float32 everywhere, no autocast, no loss
 * scaling; with its aliases "O0" (apex) and "32-true" (Lightning). It has no per-instance state;
 * create hands back a static sentinel.
 */
#include <string.h>

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
  memset(&p, 0, sizeof p);
  p.struct_size = policy->struct_size;
  p.model_dtype = KILN_DTYPE_F32;
  p.autocast = 0;
  p.compute_dtype = KILN_DTYPE_F32;
  p.master_weights = 0;
  p.norm_fp32 = 1;
  p.loss_scaling = KILN_SCALE_NONE;
  p.initial_scale = 1.0;
  p.min_scale = 0.0; /* no scale to run out of: the host never applies at_min_scale */
  p.at_min_scale = KILN_AT_MIN_SCALE_STOP;
  if (n > sizeof p.struct_size) {
    memcpy((char*)policy + sizeof p.struct_size, (const char*)&p + sizeof p.struct_size,
           n - sizeof p.struct_size);
  }
  return NULL;
}

static const kiln_precision_vtable fp32_vtable = {
    sizeof(kiln_precision_vtable), fp32_create, fp32_destroy, fp32_policy, NULL, NULL, NULL};

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

static const kiln_component_descriptor o0_component = {sizeof(kiln_component_descriptor),
                                                       KILN_COMPONENT_PRECISION,
                                                       0,
                                                       "O0",
                                                       {1, 0, 0},
                                                       "alias of fp32 (apex O0)",
                                                       &fp32_caps,
                                                       0,
                                                       NULL,
                                                       &fp32_vtable};

static const kiln_component_descriptor fp32_true_component = {sizeof(kiln_component_descriptor),
                                                              KILN_COMPONENT_PRECISION,
                                                              0,
                                                              "32-true",
                                                              {1, 0, 0},
                                                              "alias of fp32 (Lightning 32-true)",
                                                              &fp32_caps,
                                                              0,
                                                              NULL,
                                                              &fp32_vtable};

static const kiln_component_descriptor* const components[] = {&fp32_component, &o0_component,
                                                              &fp32_true_component};

static const kiln_plugin_descriptor descriptor = {sizeof(kiln_plugin_descriptor),
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR,
                                                  "kiln-fp32",
                                                  {1, 1, 0},
                                                  sizeof components / sizeof components[0],
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
