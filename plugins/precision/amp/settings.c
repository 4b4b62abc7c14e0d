/* settings.c — reading and checking a kiln_amp component's options. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "amp.h"

/* "<component>: <printf text>" as a status of `code`. */
static kiln_status* refuse(const kiln_host_api* host, int32_t code, const char* component,
                           const char* format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static kiln_status* refuse(const kiln_host_api* host, int32_t code, const char* component,
                           const char* format, ...) {
  char message[320];
  int used = snprintf(message, sizeof message, "%s: ", component);
  va_list args;
  if (used < 0 || (size_t)used >= sizeof message) used = 0;
  va_start(args, format);
  vsnprintf(message + used, sizeof message - (size_t)used, format, args);
  va_end(args);
  return host->make_status(code, message);
}

static int positive_finite(double x) { return x > 0.0 && isfinite(x); }

static kiln_status* read_dtype(const kiln_host_api* host, const kiln_amp_flavour* f,
                               const kiln_options* options, DLDevice device, int32_t* dtype) {
  const char* name = kiln_options_string(options, "dtype", "auto");
  if (f->fixed_dtype != 0) {
    *dtype = f->fixed_dtype;
  } else if (strcmp(name, "fp16") == 0) {
    *dtype = KILN_DTYPE_F16;
  } else if (strcmp(name, "bf16") == 0) {
    *dtype = KILN_DTYPE_BF16;
  } else if (strcmp(name, "auto") == 0) {
    /* fp16 where tensor cores make it fast; bf16 on CPU, where fp16 math is slow and narrow. */
    *dtype = device.device_type == kDLCUDA ? KILN_DTYPE_F16 : KILN_DTYPE_BF16;
  } else {
    return refuse(host, KILN_ERR_INVALID_ARGUMENT, f->name,
                  "dtype must be auto, fp16 or bf16, got '%s'", name);
  }
  return NULL;
}

static kiln_status* read_mode(const kiln_host_api* host, const kiln_amp_flavour* f,
                              const kiln_options* options, int32_t half_dtype, int32_t* mode) {
  /* O3 is the speed baseline: no scaling unless asked for. */
  const char* name =
      kiln_options_string(options, "scaling", f->mode == KILN_AMP_PURE ? "none" : "auto");
  if (!f->has_scaling || strcmp(name, "none") == 0) {
    *mode = KILN_SCALE_NONE;
  } else if (strcmp(name, "dynamic") == 0) {
    *mode = KILN_SCALE_DYNAMIC;
  } else if (strcmp(name, "static") == 0) {
    *mode = KILN_SCALE_STATIC;
  } else if (strcmp(name, "auto") == 0) {
    /* bf16 has fp32's exponent range: gradients do not underflow, so scaling buys nothing. */
    *mode = half_dtype == KILN_DTYPE_F16 ? KILN_SCALE_DYNAMIC : KILN_SCALE_NONE;
  } else {
    return refuse(host, KILN_ERR_INVALID_ARGUMENT, f->name,
                  "scaling must be auto, dynamic, static or none, got '%s'", name);
  }
  return NULL;
}

static kiln_status* read_at_min(const kiln_host_api* host, const kiln_amp_flavour* f,
                                const kiln_options* options, int32_t* at_min) {
  const char* name = kiln_options_string(options, "at_min_scale", "stop");
  if (strcmp(name, "stop") == 0) {
    *at_min = KILN_AT_MIN_SCALE_STOP;
  } else if (strcmp(name, "skip") == 0) {
    *at_min = KILN_AT_MIN_SCALE_SKIP;
  } else {
    return refuse(host, KILN_ERR_INVALID_ARGUMENT, f->name,
                  "at_min_scale must be stop or skip, got '%s'", name);
  }
  return NULL;
}

/* The scale options each in their own domain, and in order where the mode uses them. */
static kiln_status* check_scaling(const kiln_host_api* host, const char* name,
                                  const kiln_amp_settings* s) {
  /* torch keeps the scale in a float32 tensor, so every scale must fit one. */
  const double top = FLT_MAX;
  if (!positive_finite(s->init_scale) || s->init_scale > top) {
    return refuse(host, KILN_ERR_INVALID_ARGUMENT, name,
                  "init_scale must be > 0 and fit float32, got %.10g", s->init_scale);
  }
  if (!(s->growth_factor > 1.0) || !isfinite(s->growth_factor)) {
    return refuse(host, KILN_ERR_INVALID_ARGUMENT, name,
                  "growth_factor must be finite and > 1, got %.10g", s->growth_factor);
  }
  if (!(s->backoff_factor > 0.0 && s->backoff_factor < 1.0)) {
    return refuse(host, KILN_ERR_INVALID_ARGUMENT, name,
                  "backoff_factor must be in (0, 1), got %.10g", s->backoff_factor);
  }
  if (s->growth_interval < 1) {
    return refuse(host, KILN_ERR_INVALID_ARGUMENT, name, "growth_interval must be >= 1, got %lld",
                  (long long)s->growth_interval);
  }
  if (s->hysteresis < 1) {
    return refuse(host, KILN_ERR_INVALID_ARGUMENT, name, "hysteresis must be >= 1, got %lld",
                  (long long)s->hysteresis);
  }
  if (!positive_finite(s->min_scale) || !positive_finite(s->max_scale) || s->max_scale > top) {
    return refuse(host, KILN_ERR_INVALID_ARGUMENT, name,
                  "min_scale and max_scale must be > 0 and fit float32, got %.10g and %.10g",
                  s->min_scale, s->max_scale);
  }
  if (s->min_scale > s->max_scale) {
    return refuse(host, KILN_ERR_INVALID_ARGUMENT, name,
                  "min_scale (%.10g) must not exceed max_scale (%.10g)", s->min_scale,
                  s->max_scale);
  }
  /* A static scale ignores the bounds; a dynamic one starts inside them. */
  if (s->loss_scaling == KILN_SCALE_DYNAMIC &&
      (s->init_scale < s->min_scale || s->init_scale > s->max_scale)) {
    return refuse(host, KILN_ERR_INVALID_ARGUMENT, name,
                  "dynamic scaling needs min_scale <= init_scale <= max_scale, got %.10g <= "
                  "%.10g <= %.10g",
                  s->min_scale, s->init_scale, s->max_scale);
  }
  return NULL;
}

kiln_status* kiln_amp_read_settings(const kiln_host_api* host, const kiln_amp_flavour* f,
                                    const kiln_options* options, DLDevice device,
                                    kiln_amp_settings* out) {
  kiln_amp_settings s;
  kiln_status* status;
  if (device.device_type != kDLCPU && device.device_type != kDLCUDA) {
    return refuse(host, KILN_ERR_UNSUPPORTED, f->name,
                  "runs on cpu and cuda devices only, got DLPack device type %d",
                  (int)device.device_type);
  }
  memset(&s, 0, sizeof s);
  if ((status = read_dtype(host, f, options, device, &s.half_dtype)) != NULL) return status;
  s.norm_fp32 = f->has_norm_option
                    ? kiln_options_bool(options, "keep_norm_fp32", f->mode != KILN_AMP_PURE)
                    : 1;
  if ((status = read_mode(host, f, options, s.half_dtype, &s.loss_scaling)) != NULL) {
    return status;
  }
  s.at_min_scale = KILN_AT_MIN_SCALE_STOP;
  s.init_scale = 1.0;
  if (f->has_scaling) {
    if ((status = read_at_min(host, f, options, &s.at_min_scale)) != NULL) return status;
    s.init_scale = kiln_options_float(options, "init_scale", 65536.0);
    s.growth_factor = kiln_options_float(options, "growth_factor", 2.0);
    s.backoff_factor = kiln_options_float(options, "backoff_factor", 0.5);
    s.growth_interval = kiln_options_int(options, "growth_interval", 2000);
    s.hysteresis = kiln_options_int(options, "hysteresis", 1);
    s.min_scale = kiln_options_float(options, "min_scale", 1.0);
    s.max_scale = kiln_options_float(options, "max_scale", 16777216.0);
    if ((status = check_scaling(host, f->name, &s)) != NULL) return status;
  }
  if (s.loss_scaling == KILN_SCALE_NONE) s.init_scale = 1.0;
  *out = s;
  return NULL;
}
