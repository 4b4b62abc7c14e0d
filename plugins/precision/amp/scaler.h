/*
 * scaler.h — the dynamic loss-scale update rule of kiln_amp: torch.amp.GradScaler's growth and
 * backoff (torch._amp_update_scale_), DeepSpeed's hysteresis (overflows tolerated before a
 * backoff), and apex's bounds (the scale stays within [min_scale, max_scale]). Plain C99.
 */
#ifndef KILN_PLUGINS_AMP_SCALER_H_
#define KILN_PLUGINS_AMP_SCALER_H_

#include <stdint.h>

/* The rule's parameters (validated by the caller) and its counters. */
typedef struct kiln_amp_scaler {
  double growth_factor;    /* > 1 */
  double backoff_factor;   /* in (0, 1) */
  int64_t growth_interval; /* >= 1 consecutive clean steps before a growth */
  int64_t hysteresis;      /* >= 1 overflows in a row before a backoff; 1 = GradScaler */
  double min_scale;        /* > 0 */
  double max_scale;        /* >= min_scale */
  int64_t growth_tracker;  /* clean steps since the last growth or overflow */
  int64_t hysteresis_left; /* overflows still tolerated before the next backoff */
} kiln_amp_scaler;

/* Sets the parameters and resets the counters (a fresh GradScaler). */
void kiln_amp_scaler_init(kiln_amp_scaler* s, double growth_factor, double backoff_factor,
                          int64_t growth_interval, int64_t hysteresis, double min_scale,
                          double max_scale);

/* One optimizer step's update of `*scale`, given whether its gradients were all finite:
 *  overflow: tracker = 0; if hysteresis_left > 1 it is decremented and the scale stays, else
 *            scale = max(scale * backoff, min_scale);
 *  clean:    hysteresis_left = hysteresis; tracker += 1; at growth_interval the tracker restarts
 *            and scale = min(scale * growth, max_scale) when that is finite. */
void kiln_amp_scaler_update(kiln_amp_scaler* s, int grads_finite, double* scale);

#endif /* KILN_PLUGINS_AMP_SCALER_H_ */
