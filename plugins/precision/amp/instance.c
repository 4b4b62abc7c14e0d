/* instance.c — the instance every kiln_amp component creates: its settings, its policy, and the
 * loss-scale counters. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp.h"

typedef struct amp_instance {
  const kiln_host_api* host;
  const kiln_amp_flavour* flavour;
  kiln_amp_settings settings;
  kiln_amp_scaler scaler;
} amp_instance;

kiln_status* kiln_amp_create(const kiln_amp_flavour* flavour, const kiln_host_api* host,
                             const kiln_options* options, DLDevice device, void** out) {
  kiln_amp_settings settings;
  amp_instance* p;
  kiln_status* status = kiln_amp_read_settings(host, flavour, options, device, &settings);
  if (status != NULL) return status;
  p = (amp_instance*)calloc(1, sizeof *p);
  if (p == NULL) {
    char message[96];
    snprintf(message, sizeof message, "%s: out of memory", flavour->name);
    return host->make_status(KILN_ERR_OUT_OF_MEMORY, message);
  }
  p->host = host;
  p->flavour = flavour;
  p->settings = settings;
  kiln_amp_scaler_init(&p->scaler, settings.growth_factor, settings.backoff_factor,
                       settings.growth_interval, settings.hysteresis, settings.min_scale,
                       settings.max_scale);
  *out = p;
  return NULL;
}

void kiln_amp_destroy(void* instance) { free(instance); }

kiln_status* kiln_amp_policy(void* instance, kiln_precision_policy* policy) {
  const amp_instance* a = (const amp_instance*)instance;
  const kiln_amp_settings* s = &a->settings;
  const int half_model = a->flavour->mode != KILN_AMP_AUTOCAST;
  kiln_precision_policy p;
  /* Fill only what the host's struct_size covers (its struct may be older than ours). */
  size_t n = policy->struct_size < sizeof p ? policy->struct_size : sizeof p;
  memset(&p, 0, sizeof p);
  p.struct_size = policy->struct_size;
  p.model_dtype = half_model ? s->half_dtype : KILN_DTYPE_F32;
  p.autocast = !half_model;
  p.compute_dtype = s->half_dtype;
  p.master_weights = a->flavour->mode == KILN_AMP_MASTER;
  p.norm_fp32 = s->norm_fp32;
  p.loss_scaling = s->loss_scaling;
  p.initial_scale = s->init_scale;
  /* Only a dynamic scale can sink to a minimum; 0 tells the host at_min_scale never applies. */
  p.min_scale = s->loss_scaling == KILN_SCALE_DYNAMIC ? s->min_scale : 0.0;
  p.at_min_scale = s->at_min_scale;
  if (n > sizeof p.struct_size) {
    memcpy((char*)policy + sizeof p.struct_size, (const char*)&p + sizeof p.struct_size,
           n - sizeof p.struct_size);
  }
  return NULL;
}

kiln_status* kiln_amp_update_scale(void* instance, int32_t grads_finite, double* scale) {
  amp_instance* a = (amp_instance*)instance;
  if (!(*scale > 0.0) || !isfinite(*scale)) {
    char message[160];
    snprintf(message, sizeof message,
             "%s: update_scale got a loss scale of %.10g (must be finite, > 0)", a->flavour->name,
             *scale);
    return a->host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
  }
  /* A static scale (and no scale) never changes. */
  if (a->settings.loss_scaling == KILN_SCALE_DYNAMIC) {
    kiln_amp_scaler_update(&a->scaler, grads_finite != 0, scale);
  }
  return NULL;
}

kiln_status* kiln_amp_get_state(void* instance, double* values, size_t capacity, size_t* count) {
  const amp_instance* a = (const amp_instance*)instance;
  /* The counters as doubles: exact for any count below 2^53. */
  *count = 2;
  if (capacity >= 2) {
    values[0] = (double)a->scaler.growth_tracker;
    values[1] = (double)a->scaler.hysteresis_left;
  }
  return NULL;
}

kiln_status* kiln_amp_set_state(void* instance, const double* values, size_t count) {
  amp_instance* a = (amp_instance*)instance;
  if (count != 2 || !(values[0] >= 0.0) || !(values[1] >= 1.0)) {
    char message[128];
    snprintf(message, sizeof message,
             "%s: set_state expects 2 counters (tracker >= 0, hysteresis >= 1)", a->flavour->name);
    return a->host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
  }
  a->scaler.growth_tracker = (int64_t)values[0];
  a->scaler.hysteresis_left = (int64_t)values[1];
  return NULL;
}
