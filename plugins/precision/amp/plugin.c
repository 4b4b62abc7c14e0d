/*
 * kiln_amp — the half-precision policies, plain C99 (no LibTorch): torch.amp-style autocast,
 * apex O2 and O3, their apex and Lightning aliases, and the dynamic loss-scale rule. The host
 * does the mechanics (casting, autocast, master weights, unscaling, overflow checks).
 */
#include "amp.h"

static const kiln_component_descriptor* const components[] = {
    &kiln_amp_amp_component,        &kiln_amp_bf16_component,     &kiln_amp_o2_component,
    &kiln_amp_o3_component,         &kiln_amp_o1_component,       &kiln_amp_fp16_mixed_component,
    &kiln_amp_bf16_mixed_component, &kiln_amp_o2_upper_component, &kiln_amp_o3_upper_component,
    &kiln_amp_fp16_true_component,  &kiln_amp_bf16_true_component};

static const kiln_plugin_descriptor descriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-amp", KILN_VERSION_INIT(1, 0, 0), components, NULL);

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &descriptor; }
