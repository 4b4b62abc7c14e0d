/*
 * one_cycle — PyTorch's OneCycleLR (the rate; cycle_momentum needs schedules of other
 * hyperparameters, not in this ABI yet) over the iterations after the warm-up, the base lr
 * being max_lr: with e = it − warm − 1 and T = max − warm steps,
 *   initial = base_lr / div_factor, final = initial / final_div_factor
 *   two phases: initial → base_lr until e = pct_start·T − 1, then → final until e = T − 1;
 *   three_phase: initial → base_lr, back to initial by e = 2·pct_start·T − 2, then → final;
 * each phase annealed by cosine (end + (start − end)/2·(cos(π·pct) + 1)) or linearly, pct the
 * position within the phase, as torch computes it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lr_common.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

static const char kName[] = "one_cycle";

typedef struct one_cycle_phase {
  double end_step, start_lr, end_lr;
} one_cycle_phase;

typedef struct one_cycle_policy {
  const kiln_host_api* host;
  int64_t warmup_iters;
  int linear; /* anneal_strategy "linear" */
  int phase_count;
  one_cycle_phase phases[3];
} one_cycle_policy;

static void one_cycle_destroy(void* instance) { free(instance); }

static kiln_status* one_cycle_create(const kiln_host_api* host, const kiln_options* options,
                                     const kiln_lr_schedule* schedule, void** out) {
  const double pct = kiln_options_float(options, "pct_start", 0.3);
  const double div = kiln_options_float(options, "div_factor", 25.0);
  const double final_div = kiln_options_float(options, "final_div_factor", 1e4);
  const int three = kiln_options_bool(options, "three_phase", 0);
  double total, initial, final_lr;
  one_cycle_policy* p;
  kiln_status* status;
  if ((status = kiln_lr_check_span(host, kName, schedule)) != NULL) return status;
  total = (double)(schedule->max_iters - schedule->warmup_iters);
  p = (one_cycle_policy*)calloc(1, sizeof *p);
  if (p == NULL) return kiln_lr_out_of_memory(host, kName);
  p->host = host;
  p->warmup_iters = schedule->warmup_iters;
  p->linear = strcmp(kiln_options_string(options, "anneal_strategy", "cos"), "linear") == 0;
  initial = schedule->base_lr / div;
  final_lr = initial / final_div;
  if (three) {
    const one_cycle_phase phases[3] = {{pct * total - 1.0, initial, schedule->base_lr},
                                       {2.0 * pct * total - 2.0, schedule->base_lr, initial},
                                       {total - 1.0, initial, final_lr}};
    memcpy(p->phases, phases, sizeof phases);
    p->phase_count = 3;
  } else {
    const one_cycle_phase phases[2] = {{pct * total - 1.0, initial, schedule->base_lr},
                                       {total - 1.0, schedule->base_lr, final_lr}};
    memcpy(p->phases, phases, sizeof phases);
    p->phase_count = 2;
  }
  *out = p;
  return NULL;
}

static kiln_status* one_cycle_lr_at(void* instance, int64_t iter, double* lr) {
  const one_cycle_policy* p = (const one_cycle_policy*)instance;
  kiln_status* status = kiln_lr_check_iter(p->host, kName, iter);
  double step, start_step = 0.0;
  int i;
  if (status != NULL) return status;
  step = (double)(iter - p->warmup_iters - 1);
  if (step < 0.0) step = 0.0;
  for (i = 0; i < p->phase_count; ++i) {
    const one_cycle_phase* ph = &p->phases[i];
    if (step <= ph->end_step || i == p->phase_count - 1) {
      const double pct = (step - start_step) / (ph->end_step - start_step);
      if (p->linear) {
        *lr = (ph->end_lr - ph->start_lr) * pct + ph->start_lr;
      } else {
        const double cos_out = cos(M_PI * pct) + 1.0;
        *lr = ph->end_lr + (ph->start_lr - ph->end_lr) / 2.0 * cos_out;
      }
      break;
    }
    start_step = ph->end_step;
  }
  return NULL;
}

static const kiln_lr_policy_vtable one_cycle_vtable =
    KILN_LR_POLICY_VTABLE_INIT(one_cycle_create, one_cycle_destroy, one_cycle_lr_at);

static const kiln_option_spec one_cycle_options[] = {
    KILN_OPTION_RANGE_INIT("pct_start", KILN_OPT_FLOAT, 0.0, 1.0, "0.3",
                           "share of the steps spent rising to the base lr (max_lr), in [0, 1]"),
    KILN_OPTION_CHOICES_INIT("anneal_strategy", "cos,linear", "\"cos\"",
                             "how each phase moves between its rates"),
    KILN_OPTION_MIN_INIT("div_factor", KILN_OPT_FLOAT, 1e-12, "25.0",
                         "the first rate is base lr / div_factor"),
    KILN_OPTION_MIN_INIT("final_div_factor", KILN_OPT_FLOAT, 1e-12, "1e4",
                         "the last rate is the first / final_div_factor"),
    KILN_OPTION_INIT("three_phase", KILN_OPT_BOOL, "false",
                     "back down to the first rate before the final annealing (fastai's order)"),
};

const kiln_component_descriptor kiln_lr_one_cycle_component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "one_cycle", KILN_VERSION_INIT(1, 0, 0),
    "PyTorch's OneCycleLR(max_lr = base lr, total_steps = max - W) for the rate, started after "
    "a warm-up of W: up from base lr / div_factor, then down to that / final_div_factor",
    &kiln_lr_capabilities, one_cycle_options, &one_cycle_vtable);
