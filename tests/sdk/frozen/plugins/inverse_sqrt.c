/*
 * inverse_sqrt — an out-of-tree learning-rate policy in plain C99, built against the installed
 * Kiln SDK alone (no LibTorch, no Kiln sources):
 *
 *   lr(iter) = base_lr * min(1, sqrt(offset / iter))
 *
 * the inverse-square-root decay of "Attention Is All You Need", flat for the first `offset`
 * iterations. The host applies any warm-up itself before calling lr_at.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/lr_policy.h"
#include "kiln/plugin.h"

typedef struct inverse_sqrt {
  const kiln_host_api* host; /* valid for the life of the process */
  double base_lr;
  double offset;
} inverse_sqrt;

static kiln_status* create(const kiln_host_api* host, const kiln_options* options,
                           const kiln_lr_schedule* schedule, void** out) {
  /* Options arrive validated against the schema below (offset is an integer >= 1). */
  const int64_t offset = kiln_options_int(options, "offset", 100);
  inverse_sqrt* p = (inverse_sqrt*)calloc(1, sizeof *p);
  if (p == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "inverse_sqrt: out of memory");
  p->host = host;
  p->base_lr = schedule->base_lr;
  p->offset = (double)offset;
  *out = p;
  return NULL;
}

static void destroy(void* instance) { free(instance); }

static kiln_status* lr_at(void* instance, int64_t iter, double* lr) {
  const inverse_sqrt* p = (const inverse_sqrt*)instance;
  if (iter < 1) {
    char message[96];
    snprintf(message, sizeof message, "inverse_sqrt: iteration must be >= 1, got %lld",
             (long long)iter);
    return p->host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
  }
  const double factor = sqrt(p->offset / (double)iter);
  *lr = p->base_lr * (factor < 1.0 ? factor : 1.0);
  return NULL;
}

static const kiln_lr_policy_vtable vtable = {sizeof(kiln_lr_policy_vtable), create, destroy, lr_at};

static const kiln_capabilities caps = {sizeof(kiln_capabilities),
                                       KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA, 0, NULL};

static const kiln_option_spec options[] = {
    {sizeof(kiln_option_spec), "offset", KILN_OPT_INT, 1, 0, 0, 1.0, 0.0, "100", NULL,
     "iterations before the decay starts; lr = base_lr * sqrt(offset / iter) after"}};

static const kiln_component_descriptor component = {
    sizeof(kiln_component_descriptor),
    KILN_COMPONENT_LR_POLICY,
    0,
    "inverse_sqrt",
    {1, 0, 0},
    "base_lr * min(1, sqrt(offset / iter)) (an out-of-tree example)",
    &caps,
    sizeof options / sizeof options[0],
    options,
    &vtable};

static const kiln_component_descriptor* const components[] = {&component};

static const kiln_plugin_descriptor descriptor = {sizeof(kiln_plugin_descriptor),
                                                  KILN_ABI_MAJOR,
                                                  KILN_ABI_MINOR,
                                                  "example-inverse-sqrt",
                                                  {1, 0, 0},
                                                  1,
                                                  components,
                                                  NULL,
                                                  NULL,
                                                  -1,
                                                  0};

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
