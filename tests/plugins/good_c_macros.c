/* A plain-C plugin written with the SDK's initialiser macros only (no positional struct lists):
 * the LR policy "c_linear", lr = base_lr x (1 - (1 - end_factor) x t) with t = (iter - 1 -
 * hold_iters) / (max_iters - hold_iters) clamped to [0, 1], or base_lr throughout with mode
 * "constant". One option of each macro form. */
#include <stdlib.h>

#include "kiln/lr_policy.h"
#include "kiln/plugin.h"

typedef struct c_linear {
  double base_lr, end_factor;
  int64_t hold_iters, max_iters;
  int constant;
} c_linear;

static kiln_status* c_linear_create(const kiln_host_api* host, const kiln_options* options,
                                    const kiln_lr_schedule* schedule, void** out) {
  c_linear* p = (c_linear*)malloc(sizeof *p);
  const char* mode = kiln_options_string(options, "mode", "linear");
  if (p == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "c_linear: out of memory");
  p->base_lr = schedule->base_lr;
  p->end_factor = kiln_options_float(options, "end_factor", 0.0);
  p->hold_iters = kiln_options_int(options, "hold_iters", 0);
  p->max_iters = schedule->max_iters;
  p->constant = mode[0] == 'c';
  if (kiln_options_bool(options, "strict", 0) && p->hold_iters >= p->max_iters) {
    free(p);
    return host->make_status(KILN_ERR_INVALID_ARGUMENT, "c_linear: hold_iters >= max_iters");
  }
  *out = p;
  return NULL;
}

static void c_linear_destroy(void* instance) { free(instance); }

static kiln_status* c_linear_lr_at(void* instance, int64_t iter, double* lr) {
  const c_linear* p = (const c_linear*)instance;
  const int64_t span = p->max_iters - p->hold_iters;
  double t = span > 0 ? (double)(iter - 1 - p->hold_iters) / (double)span : 1.0;
  if (t < 0.0) t = 0.0;
  if (t > 1.0) t = 1.0;
  *lr = p->constant ? p->base_lr : p->base_lr * (1.0 - (1.0 - p->end_factor) * t);
  return NULL;
}

static const kiln_lr_policy_vtable vtable =
    KILN_LR_POLICY_VTABLE_INIT(c_linear_create, c_linear_destroy, c_linear_lr_at);
static const kiln_attribute attributes[] = {{"written_with", "initialiser macros"}};
static const kiln_capabilities caps =
    KILN_CAPABILITIES_ATTRIBUTES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA, attributes);
static const kiln_option_spec options[] = {
    KILN_OPTION_RANGE_INIT("end_factor", KILN_OPT_FLOAT, 0.0, 1.0, "0.0",
                           "lr factor at the last iteration, in [0, 1]"),
    KILN_OPTION_MIN_INIT("hold_iters", KILN_OPT_INT, 0.0, "0", "iterations at base_lr first"),
    KILN_OPTION_CHOICES_INIT("mode", "linear,constant", "\"linear\"", "linear decay or none"),
    KILN_OPTION_INIT("strict", KILN_OPT_BOOL, "false", "refuse hold_iters >= max_iters"),
};
static const kiln_component_descriptor component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "c_linear", KILN_VERSION_INIT(1, 2, 3),
    "linear decay after a hold, in C with the SDK's initialiser macros", &caps, options, &vtable);
static const kiln_component_descriptor* const components[] = {&component};
static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("good-c-macros", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
