/* lr_common.c — validation and conversions shared by the learning-rate policies. */
#include "lr_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

const kiln_capabilities kiln_lr_capabilities =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA);

kiln_status* kiln_lr_invalid(const kiln_host_api* host, const char* policy, const char* format,
                             ...) {
  char message[256];
  int used = snprintf(message, sizeof message, "%s: ", policy);
  va_list args;
  if (used < 0 || (size_t)used >= sizeof message) used = 0;
  va_start(args, format);
  vsnprintf(message + used, sizeof message - (size_t)used, format, args);
  va_end(args);
  return host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
}

kiln_status* kiln_lr_out_of_memory(const kiln_host_api* host, const char* policy) {
  char message[96];
  snprintf(message, sizeof message, "%s: out of memory", policy);
  return host->make_status(KILN_ERR_OUT_OF_MEMORY, message);
}

kiln_status* kiln_lr_check_iter(const kiln_host_api* host, const char* policy, int64_t iter) {
  if (iter >= 1) return NULL;
  return kiln_lr_invalid(host, policy, "iterations are 1-based, got iteration %lld",
                         (long long)iter);
}

kiln_status* kiln_lr_check_gamma(const kiln_host_api* host, const char* policy, double gamma) {
  if (gamma > 0.0 && gamma <= 1.0) return NULL;
  return kiln_lr_invalid(host, policy, "gamma must be in (0, 1], got %g", gamma);
}

kiln_status* kiln_lr_check_min_lr(const kiln_host_api* host, const char* policy, double min_lr,
                                  double base_lr) {
  if (!(min_lr >= 0.0)) {
    return kiln_lr_invalid(host, policy, "min_lr must be >= 0, got %g", min_lr);
  }
  if (min_lr > base_lr) {
    return kiln_lr_invalid(host, policy, "min_lr (%g) must not exceed the base lr (%g)", min_lr,
                           base_lr);
  }
  return NULL;
}

kiln_status* kiln_lr_check_span(const kiln_host_api* host, const char* policy,
                                const kiln_lr_schedule* schedule) {
  if (schedule->max_iters > schedule->warmup_iters) return NULL;
  return kiln_lr_invalid(host, policy, "max_iters (%lld) must exceed warmup_iters (%lld)",
                         (long long)schedule->max_iters, (long long)schedule->warmup_iters);
}

kiln_status* kiln_lr_duration_scale(const kiln_host_api* host, const char* policy,
                                    const kiln_options* options, const kiln_lr_schedule* schedule,
                                    int64_t* scale) {
  if (!kiln_options_bool(options, "by_epoch", 0)) {
    *scale = 1;
    return NULL;
  }
  if (schedule->iters_per_epoch < 1) {
    return kiln_lr_invalid(host, policy, "by_epoch needs iters_per_epoch >= 1, got %lld",
                           (long long)schedule->iters_per_epoch);
  }
  *scale = schedule->iters_per_epoch;
  return NULL;
}

kiln_status* kiln_lr_to_iters(const kiln_host_api* host, const char* policy, const char* name,
                              int64_t value, int64_t scale, int64_t* out) {
  if (value < 1) {
    return kiln_lr_invalid(host, policy, "%s must be positive, got %lld", name, (long long)value);
  }
  if (value > INT64_MAX / scale) {
    return kiln_lr_invalid(host, policy, "%s %lld times %lld iterations per epoch overflows", name,
                           (long long)value, (long long)scale);
  }
  *out = value * scale;
  return NULL;
}

kiln_status* kiln_lr_read_boundaries(const kiln_host_api* host, const char* policy,
                                     const kiln_options* options, const char* name,
                                     int allow_repeats, int64_t scale, int64_t** out,
                                     size_t* count) {
  const kiln_option_value* list = kiln_options_find(options, name);
  size_t n = (list != NULL && list->type == KILN_OPT_INT_LIST) ? list->list_length : 0;
  int64_t* values = NULL;
  size_t i;
  *out = NULL;
  *count = 0;
  for (i = 0; i < n; ++i) {
    int64_t v = list->int_list[i];
    if (v < 1) {
      return kiln_lr_invalid(host, policy, "%s must be positive, got %lld at index %zu", name,
                             (long long)v, i);
    }
    if (i > 0 && (allow_repeats ? v < list->int_list[i - 1] : v <= list->int_list[i - 1])) {
      return kiln_lr_invalid(host, policy, "%s must be %s, got %lld after %lld at index %zu", name,
                             allow_repeats ? "non-decreasing" : "strictly increasing", (long long)v,
                             (long long)list->int_list[i - 1], i);
    }
  }
  if (n == 0) return NULL;
  values = (int64_t*)malloc(n * sizeof *values);
  if (values == NULL) return kiln_lr_out_of_memory(host, policy);
  for (i = 0; i < n; ++i) {
    kiln_status* status =
        kiln_lr_to_iters(host, policy, name, list->int_list[i], scale, &values[i]);
    if (status != NULL) {
      free(values);
      return status;
    }
  }
  *out = values;
  *count = n;
  return NULL;
}

size_t kiln_lr_bisect_right(const int64_t* values, size_t count, int64_t x) {
  size_t lo = 0, hi = count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (x < values[mid]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}
