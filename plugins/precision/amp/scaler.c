/* scaler.c — the dynamic loss-scale update rule (see scaler.h). */
#include "scaler.h"

#include <math.h>

void kiln_amp_scaler_init(kiln_amp_scaler* s, double growth_factor, double backoff_factor,
                          int64_t growth_interval, int64_t hysteresis, double min_scale,
                          double max_scale) {
  s->growth_factor = growth_factor;
  s->backoff_factor = backoff_factor;
  s->growth_interval = growth_interval;
  s->hysteresis = hysteresis;
  s->min_scale = min_scale;
  s->max_scale = max_scale;
  s->growth_tracker = 0;
  s->hysteresis_left = hysteresis;
}

void kiln_amp_scaler_update(kiln_amp_scaler* s, int grads_finite, double* scale) {
  if (!grads_finite) {
    /* As torch: any overflow restarts the count of clean steps, backoff or not. */
    s->growth_tracker = 0;
    if (s->hysteresis_left > 1) {
      --s->hysteresis_left;
      return;
    }
    *scale = fmax(*scale * s->backoff_factor, s->min_scale);
    return;
  }
  /* DeepSpeed's consecutive_hysteresis: only overflows in a row count towards a backoff. */
  s->hysteresis_left = s->hysteresis;
  if (++s->growth_tracker < s->growth_interval) return;
  s->growth_tracker = 0;
  {
    double grown = *scale * s->growth_factor;
    /* torch keeps the scale when growing would overflow; the cap makes that moot unless the
     * caller's scale was already at the edge of double. */
    if (isfinite(grown)) *scale = fmin(grown, s->max_scale);
  }
}
