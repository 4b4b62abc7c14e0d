/*
 * lr_common.h — what the learning-rate policies of kiln_lr_schedules share: option validation that
 * names the offending value, epoch-to-iteration conversion, and the milestone search. Internal to
 * the library (the version script keeps these symbols local).
 */
#ifndef KILN_PLUGINS_LR_COMMON_H_
#define KILN_PLUGINS_LR_COMMON_H_

#include "kiln/lr_policy.h"
#include "kiln/plugin.h"

/* The components of this library, one per source file. */
extern const kiln_component_descriptor kiln_lr_constant_component;
extern const kiln_component_descriptor kiln_lr_step_component;
extern const kiln_component_descriptor kiln_lr_multistep_component;
extern const kiln_component_descriptor kiln_lr_cosine_component;
extern const kiln_component_descriptor kiln_lr_poly_component;
extern const kiln_component_descriptor kiln_lr_exp_component;
extern const kiln_component_descriptor kiln_lr_plateau_component;
extern const kiln_component_descriptor kiln_lr_cosine_restarts_component;
extern const kiln_component_descriptor kiln_lr_one_cycle_component;
extern const kiln_component_descriptor kiln_lr_cyclic_component;
extern const kiln_component_descriptor kiln_lr_linear_component;

/* Capabilities shared by every policy: pure arithmetic, usable with any device. */
extern const kiln_capabilities kiln_lr_capabilities;

/* A KILN_ERR_INVALID_ARGUMENT status whose message is "<policy>: <printf-formatted text>". */
kiln_status* kiln_lr_invalid(const kiln_host_api* host, const char* policy, const char* format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* A KILN_ERR_OUT_OF_MEMORY status naming `policy`. */
kiln_status* kiln_lr_out_of_memory(const kiln_host_api* host, const char* policy);

/* Refuses a 1-based iteration below 1 (lr_at's domain). */
kiln_status* kiln_lr_check_iter(const kiln_host_api* host, const char* policy, int64_t iter);

/* Refuses gamma outside (0, 1]. */
kiln_status* kiln_lr_check_gamma(const kiln_host_api* host, const char* policy, double gamma);

/* Refuses min_lr outside [0, base_lr]. */
kiln_status* kiln_lr_check_min_lr(const kiln_host_api* host, const char* policy, double min_lr,
                                  double base_lr);

/* Refuses a schedule with no iterations after warm-up (policies that decay over that span). */
kiln_status* kiln_lr_check_span(const kiln_host_api* host, const char* policy,
                                const kiln_lr_schedule* schedule);

/* Iterations per unit of the policy's durations: schedule->iters_per_epoch when the option
 * by_epoch is true (mmengine's convert_to_iter_based), else 1. Refuses by_epoch without a
 * positive iters_per_epoch. */
kiln_status* kiln_lr_duration_scale(const kiln_host_api* host, const char* policy,
                                    const kiln_options* options, const kiln_lr_schedule* schedule,
                                    int64_t* scale);

/* Converts the duration `value` of option `name` to iterations (value * scale), refusing values
 * below 1 and products that overflow int64. */
kiln_status* kiln_lr_to_iters(const kiln_host_api* host, const char* policy, const char* name,
                              int64_t value, int64_t scale, int64_t* out);

/* Reads the int-list option `name` (absent: empty) as iteration boundaries, each converted with
 * kiln_lr_to_iters. Items must increase strictly, or only not decrease when `allow_repeats`
 * (a repeat then applies its factor again, as in PyTorch's MultiStepLR). `*out` receives a
 * malloc'd array (NULL when empty) owned by the caller, `*count` its length. */
kiln_status* kiln_lr_read_boundaries(const kiln_host_api* host, const char* policy,
                                     const kiln_options* options, const char* name,
                                     int allow_repeats, int64_t scale, int64_t** out,
                                     size_t* count);

/* Python's bisect.bisect_right: how many of the sorted `values` are <= `x`. */
size_t kiln_lr_bisect_right(const int64_t* values, size_t count, int64_t x);

#endif /* KILN_PLUGINS_LR_COMMON_H_ */
