/*
 * components.c — the policies of kiln_amp and their aliases (apex O1–O3, Lightning's precision
 * names). An alias is a component of its own with the same code, its own option table (so its
 * defaults can differ) and a summary that says what it aliases.
 */
#include "amp.h"

/* The host reads a lower bound equal to the smallest denormal as "> 0". */
#define AMP_POSITIVE 4.9406564584124654e-324
/* torch keeps the loss scale in a float32 tensor (FLT_MAX, spelled out for a static
 * initializer). */
#define AMP_FLOAT32_MAX 3.4028234663852886e+38

#define AMP_DTYPE_SPEC                                                                          \
  KILN_OPTION_SPEC_INIT("dtype", KILN_OPT_STRING, 0, 0.0, 0, 0.0, "\"auto\"", "auto,fp16,bf16", \
                        "half dtype: fp16, bf16, or auto (fp16 on CUDA, bf16 on CPU)")

#define AMP_NORM_SPEC(default_value)                                                          \
  KILN_OPTION_SPEC_INIT("keep_norm_fp32", KILN_OPT_BOOL, 0, 0.0, 0, 0.0, default_value, NULL, \
                        "keep norm layers in fp32 in the half model (apex keep_batchnorm_fp32)")

/* The loss-scaling options; `scaling` defaults to `default_scaling` (a TOML string literal). */
#define AMP_SCALING_SPECS(default_scaling)                                                       \
  KILN_OPTION_SPEC_INIT(                                                                         \
      "scaling", KILN_OPT_STRING, 0, 0.0, 0, 0.0, default_scaling, "auto,dynamic,static,none",   \
      "loss scaling: dynamic, static (init_scale throughout), none, or auto (dynamic for "       \
      "fp16, none for bf16)"),                                                                   \
      KILN_OPTION_SPEC_INIT(                                                                     \
          "init_scale", KILN_OPT_FLOAT, 1, AMP_POSITIVE, 1, AMP_FLOAT32_MAX, "65536.0", NULL,    \
          "first loss scale (GradScaler init_scale); the scale itself when static"),             \
      KILN_OPTION_SPEC_INIT("growth_factor", KILN_OPT_FLOAT, 1, 1.0, 0, 0.0, "2.0", NULL,        \
                            "scale multiplier after growth_interval clean steps in a row; > 1"), \
      KILN_OPTION_SPEC_INIT("backoff_factor", KILN_OPT_FLOAT, 1, AMP_POSITIVE, 1, 1.0, "0.5",    \
                            NULL, "scale multiplier when gradients overflow; in (0, 1)"),        \
      KILN_OPTION_SPEC_INIT("growth_interval", KILN_OPT_INT, 1, 1.0, 0, 0.0, "2000", NULL,       \
                            "clean steps in a row before the scale grows"),                      \
      KILN_OPTION_SPEC_INIT(                                                                     \
          "hysteresis", KILN_OPT_INT, 1, 1.0, 0, 0.0, "1", NULL,                                 \
          "overflows in a row before the scale backs off (DeepSpeed's delayed shift); 1 = "      \
          "GradScaler"),                                                                         \
      KILN_OPTION_SPEC_INIT(                                                                     \
          "min_scale", KILN_OPT_FLOAT, 1, AMP_POSITIVE, 1, AMP_FLOAT32_MAX, "1.0", NULL,         \
          "the scale never backs off below this; an overflow at it triggers at_min_scale"),      \
      KILN_OPTION_SPEC_INIT("max_scale", KILN_OPT_FLOAT, 1, AMP_POSITIVE, 1, AMP_FLOAT32_MAX,    \
                            "16777216.0", NULL,                                                  \
                            "the scale never grows above this (apex's cap, 2^24)"),              \
      KILN_OPTION_SPEC_INIT(                                                                     \
          "at_min_scale", KILN_OPT_STRING, 0, 0.0, 0, 0.0, "\"stop\"", "stop,skip",              \
          "on an overflow at min_scale: stop (save and end the run) or skip (skip the "          \
          "step, warn, go on)")

static const kiln_option_spec amp_options[] = {AMP_DTYPE_SPEC, AMP_SCALING_SPECS("\"auto\"")};
static const kiln_option_spec fp16_mixed_options[] = {AMP_SCALING_SPECS("\"auto\"")};
static const kiln_option_spec o2_options[] = {AMP_DTYPE_SPEC, AMP_NORM_SPEC("true"),
                                              AMP_SCALING_SPECS("\"auto\"")};
static const kiln_option_spec o3_options[] = {AMP_DTYPE_SPEC, AMP_NORM_SPEC("false"),
                                              AMP_SCALING_SPECS("\"none\"")};
static const kiln_option_spec fp16_true_options[] = {AMP_NORM_SPEC("false"),
                                                     AMP_SCALING_SPECS("\"none\"")};
static const kiln_option_spec bf16_true_options[] = {AMP_NORM_SPEC("false")};

static const kiln_capabilities amp_caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32 |
                           KILN_CAP_DTYPE_F16 | KILN_CAP_DTYPE_BF16);

/* A flavour, the create that binds it, and the vtable around that create. The trailing slots are
 * AMP_SCALED, or AMP_UNSCALED for components without scaling options (scale 1 for good). */
#define AMP_FLAVOUR(id, name, mode, fixed_dtype, has_norm_option, has_scaling, ...)       \
  static const kiln_amp_flavour id##_flavour = {name, mode, fixed_dtype, has_norm_option, \
                                                has_scaling};                             \
  static kiln_status* id##_create(const kiln_host_api* host, const kiln_options* options, \
                                  DLDevice device, void** out) {                          \
    return kiln_amp_create(&id##_flavour, host, options, device, out);                    \
  }                                                                                       \
  static const kiln_precision_vtable id##_vtable =                                        \
      KILN_PRECISION_VTABLE_INIT(id##_create, kiln_amp_destroy, kiln_amp_policy, __VA_ARGS__);

/* The scale-rule slots: update_scale, get_state, set_state. */
#define AMP_SCALED kiln_amp_update_scale, kiln_amp_get_state, kiln_amp_set_state
#define AMP_UNSCALED NULL, NULL, NULL
AMP_FLAVOUR(amp, "amp", KILN_AMP_AUTOCAST, 0, 0, 1, AMP_SCALED)
AMP_FLAVOUR(o1, "O1", KILN_AMP_AUTOCAST, 0, 0, 1, AMP_SCALED)
AMP_FLAVOUR(fp16_mixed, "16-mixed", KILN_AMP_AUTOCAST, KILN_DTYPE_F16, 0, 1, AMP_SCALED)
AMP_FLAVOUR(bf16, "bf16", KILN_AMP_AUTOCAST, KILN_DTYPE_BF16, 0, 0, AMP_UNSCALED)
AMP_FLAVOUR(bf16_mixed, "bf16-mixed", KILN_AMP_AUTOCAST, KILN_DTYPE_BF16, 0, 0, AMP_UNSCALED)
AMP_FLAVOUR(o2, "o2", KILN_AMP_MASTER, 0, 1, 1, AMP_SCALED)
AMP_FLAVOUR(o2_upper, "O2", KILN_AMP_MASTER, 0, 1, 1, AMP_SCALED)
AMP_FLAVOUR(o3, "o3", KILN_AMP_PURE, 0, 1, 1, AMP_SCALED)
AMP_FLAVOUR(o3_upper, "O3", KILN_AMP_PURE, 0, 1, 1, AMP_SCALED)
AMP_FLAVOUR(fp16_true, "16-true", KILN_AMP_PURE, KILN_DTYPE_F16, 1, 1, AMP_SCALED)
AMP_FLAVOUR(bf16_true, "bf16-true", KILN_AMP_PURE, KILN_DTYPE_BF16, 1, 0, AMP_UNSCALED)

/* A component with options (a static kiln_option_spec array); AMP_COMPONENT_NO_OPTIONS without. */
#define AMP_COMPONENT(id, name, summary, options)                                             \
  const kiln_component_descriptor kiln_amp_##id##_component =                                 \
      KILN_COMPONENT_OPTIONS_INIT(KILN_COMPONENT_PRECISION, name, KILN_VERSION_INIT(1, 0, 0), \
                                  summary, &amp_caps, options, &id##_vtable);
#define AMP_COMPONENT_NO_OPTIONS(id, name, summary)                                            \
  const kiln_component_descriptor kiln_amp_##id##_component =                                  \
      KILN_COMPONENT_INIT(KILN_COMPONENT_PRECISION, name, KILN_VERSION_INIT(1, 0, 0), summary, \
                          &amp_caps, &id##_vtable);

AMP_COMPONENT(amp, "amp",
              "mixed precision as torch.amp (apex O1): fp32 weights, forward under fp16 or bf16 "
              "autocast, dynamic loss scaling for fp16",
              amp_options)
AMP_COMPONENT(o1, "O1", "alias of amp (apex O1)", amp_options)
AMP_COMPONENT(fp16_mixed, "16-mixed",
              "alias of amp with dtype fp16 (Lightning 16-mixed): fp16 autocast, dynamic loss "
              "scaling",
              fp16_mixed_options)
AMP_COMPONENT_NO_OPTIONS(bf16, "bf16", "bf16 autocast on fp32 weights, no loss scaling")
AMP_COMPONENT_NO_OPTIONS(bf16_mixed, "bf16-mixed", "alias of bf16 (Lightning bf16-mixed)")
AMP_COMPONENT(o2, "o2",
              "half weights with fp32 master weights (apex O2), norm layers fp32 by default, "
              "dynamic loss scaling for fp16",
              o2_options)
AMP_COMPONENT(o2_upper, "O2", "alias of o2 (apex O2)", o2_options)
AMP_COMPONENT(o3, "o3",
              "pure half precision (apex O3): half weights and optimizer, no loss scaling by "
              "default; the speed baseline",
              o3_options)
AMP_COMPONENT(o3_upper, "O3", "alias of o3 (apex O3)", o3_options)
AMP_COMPONENT(fp16_true, "16-true", "alias of o3 with dtype fp16 (Lightning 16-true)",
              fp16_true_options)
AMP_COMPONENT(bf16_true, "bf16-true",
              "alias of o3 with dtype bf16 (Lightning bf16-true), no loss scaling",
              bf16_true_options)
