/*
 * kiln_lr_schedules — the learning-rate policies, plain C99 (no LibTorch). The host applies warm-up
 * for iterations 1..warmup_iters; these compute the rate after it. Formulas in each component's
 * file.
 */
#include "lr_common.h"

static const kiln_component_descriptor* const components[] = {
    &kiln_lr_constant_component,  &kiln_lr_step_component,
    &kiln_lr_multistep_component, &kiln_lr_cosine_component,
    &kiln_lr_poly_component,      &kiln_lr_exp_component,
    &kiln_lr_plateau_component,   &kiln_lr_cosine_restarts_component,
    &kiln_lr_one_cycle_component, &kiln_lr_cyclic_component,
    &kiln_lr_linear_component};

static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-lr-schedules", KILN_VERSION_INIT(2, 1, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
