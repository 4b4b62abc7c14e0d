/* In-process components through the C API, from plain C (kiln/kiln.h, kiln/plugin.h and
 * kiln/lr_policy.h; no LibTorch): an LR policy whose functions live in this program, passed in
 * kiln_session_options.components, trains a short session with the lr its formula gives; the
 * descriptor is validated as a library's (refusals name the origin and the reason), its options
 * against its schema, and a failing lr_at fails the step with the component's message.
 * Usage: capi_inproc_test <work dir> */
#include <kiln/kiln.h>
#include <kiln/lr_policy.h>
#include <kiln/plugin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"

/* ---- the in-process LR policy "c_inproc_step": lr = base_lr * gamma^floor((iter - 1) /
 * step_size); with fail_at > 0, lr_at(fail_at) fails ---- */

typedef struct step_policy {
  const kiln_host_api* host;
  double base_lr, gamma;
  int64_t step_size, fail_at;
} step_policy;

static int init_calls, create_calls, destroy_calls;
static double seen_base_lr;

static kiln_status* policy_init(const kiln_host_api* host) {
  ++init_calls;
  return host->struct_size >= KILN_HOST_API_V1_SIZE
             ? NULL
             : host->make_status(KILN_ERR_INTERNAL, "small host");
}

static kiln_status* policy_create(const kiln_host_api* host, const kiln_options* options,
                                  const kiln_lr_schedule* schedule, void** out) {
  step_policy* p = (step_policy*)calloc(1, sizeof *p);
  if (p == NULL) return host->make_status(KILN_ERR_OUT_OF_MEMORY, "c_inproc_step: no memory");
  p->host = host;
  p->base_lr = schedule->base_lr;
  p->gamma = kiln_options_float(options, "gamma", -1.0);
  p->step_size = kiln_options_int(options, "step_size", -1);
  p->fail_at = kiln_options_int(options, "fail_at", -1);
  seen_base_lr = schedule->base_lr;
  ++create_calls;
  *out = p;
  return NULL;
}

static void policy_destroy(void* instance) {
  if (instance != NULL) ++destroy_calls;
  free(instance);
}

static double step_formula(double base_lr, double gamma, int64_t step_size, int64_t iter) {
  return base_lr * pow(gamma, (double)((iter - 1) / step_size));
}

static kiln_status* policy_lr_at(void* instance, int64_t iter, double* lr) {
  const step_policy* p = (const step_policy*)instance;
  if (p->fail_at > 0 && iter == p->fail_at) {
    char message[96];
    snprintf(message, sizeof message, "c_inproc_step: refusing iteration %lld", (long long)iter);
    return p->host->make_status(KILN_ERR_INVALID_ARGUMENT, message);
  }
  *lr = step_formula(p->base_lr, p->gamma, p->step_size, iter);
  return NULL;
}

static const kiln_lr_policy_vtable vtable =
    KILN_LR_POLICY_VTABLE_INIT(policy_create, policy_destroy, policy_lr_at);
static const kiln_capabilities caps =
    KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA);
static const kiln_option_spec options[] = {
    KILN_OPTION_RANGE_INIT("gamma", KILN_OPT_FLOAT, 0.0, 1.0, "0.5", "decay factor per step"),
    KILN_OPTION_MIN_INIT("step_size", KILN_OPT_INT, 1.0, "2", "iterations per decay"),
    KILN_OPTION_MIN_INIT("fail_at", KILN_OPT_INT, 0.0, "0", "lr_at fails at this iteration"),
};
static const kiln_component_descriptor component = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_LR_POLICY, "c_inproc_step", KILN_VERSION_INIT(1, 0, 0),
    "step decay held by the test program", &caps, options, &vtable);
static const kiln_component_descriptor* const components[] = {&component};

/* A descriptor as kiln_plugin_get would return it, copied so each case can spoil one field. */
static kiln_plugin_descriptor good(void) {
  kiln_plugin_descriptor d = KILN_PLUGIN_DESCRIPTOR_INIT(
      "capi-inproc-test", KILN_VERSION_INIT(1, 0, 0), components, policy_init);
  return d;
}

/* A component named like a built-in plugin's ("constant", an LR policy). */
static const kiln_component_descriptor clash =
    KILN_COMPONENT_OPTIONS_INIT(KILN_COMPONENT_LR_POLICY, "constant", KILN_VERSION_INIT(1, 0, 0),
                                NULL, &caps, options, &vtable);
static const kiln_component_descriptor* const clashing[] = {&clash};

/* ---- sessions ---- */

static char pipeline[4096];

static void make_pipeline(const char* work, const char* policy_table) {
  snprintf(pipeline, sizeof pipeline,
           "[run]\nepochs = 1\nseed = 3\nthreads = 1\noutput_dir = \"%s/out\"\n"
           "checkpoints = false\n"
           "[data]\ndataset = \"synthetic\"\nsynthetic_train = 512\nsynthetic_test = 64\n"
           "synthetic_classes = 4\nchannels = 1\nheight = 8\nwidth = 8\nbatch_size = 64\n"
           "[model]\nname = \"mlp\"\nhidden = [16]\n"
           "[optimizer]\nname = \"sgd\"\nlr = 0.1\nmomentum = 0.9\n"
           "[lr_policy]\n%s",
           work, policy_table);
}

static kiln_session_options with(const kiln_plugin_descriptor* const* ds, size_t n) {
  kiln_session_options o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.log_level = KILN_SESSION_LOG_WARN;
  o.components = ds;
  o.component_count = n;
  o.component_origin = "capi_inproc_test";
  return o;
}

/* Creates a session that must fail with `code` and a message holding each of `words` (NULL
 * ends them). */
static void refused(const kiln_session_options* o, int32_t code, const char* const* words) {
  kiln_session* s = NULL;
  kiln_status* st = api->session_create_from_string(pipeline, "inproc.toml", o, &s);
  CHECK(s == NULL);
  CHECK(api->status_code(st) == code);
  for (; *words != NULL; ++words) {
    if (strstr(api->status_message(st), *words) == NULL) {
      fprintf(stderr, "message lacks '%s': %s\n", *words, api->status_message(st));
      ++failures;
    }
  }
  api->status_release(st);
  if (s != NULL) api->session_destroy(s);
}

static double lrs[64];
static int lr_count;
static int32_t record_lr(void* user_data, const kiln_metrics* m) {
  (void)user_data;
  if (m->kind == KILN_METRICS_STEP && lr_count < 64) lrs[lr_count++] = m->lr;
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: capi_inproc_test <work dir>\n");
    return 2;
  }
  const char* work = argv[1];
  mkdir(work, 0755);
  api = kiln_get_api(1);
  CHECK(api != NULL);
  if (api == NULL) return 1;

  /* The policy trains a session: one epoch of 8 steps, lr as the formula says. */
  const kiln_plugin_descriptor d = good();
  const kiln_plugin_descriptor* const one[] = {&d};
  make_pipeline(work, "name = \"c_inproc_step\"\ngamma = 0.25\nstep_size = 3\n");
  kiln_session_options o = with(one, 1);
  kiln_session* s = NULL;
  ok(api->session_create_from_string(pipeline, "inproc.toml", &o, &s), "create");
  CHECK(init_calls == 1 && create_calls == 1);
  ok(api->session_set_metrics_callback(s, record_lr, NULL), "set callback");
  ok(api->session_run(s), "run");
  CHECK(lr_count == 8);
  CHECK(seen_base_lr > 0.0);
  for (int i = 0; i < lr_count; ++i) {
    const double want = step_formula(seen_base_lr, 0.25, 3, i + 1);
    if (fabs(lrs[i] - want) > 1e-12 * fabs(want)) {
      fprintf(stderr, "step %d: lr %.17g, the formula says %.17g\n", i + 1, lrs[i], want);
      ++failures;
    }
  }
  CHECK(lr_count == 8 && lrs[7] < lrs[0]);
  api->session_destroy(s);
  CHECK(destroy_calls == create_calls);

  /* A failing lr_at fails the step with the component's message (and the session for good). */
  make_pipeline(work, "name = \"c_inproc_step\"\nfail_at = 3\n");
  ok(api->session_create_from_string(pipeline, "inproc.toml", &o, &s), "create failing");
  ok(api->session_step(s), "step 1");
  ok(api->session_step(s), "step 2");
  kiln_status* st = api->session_step(s);
  CHECK(api->status_code(st) == KILN_ERR_RUN_FAILED);
  CHECK(st != NULL && strstr(api->status_message(st), "c_inproc_step: refusing iteration 3"));
  if (st != NULL) fprintf(stderr, "(expected) %s\n", api->status_message(st));
  api->status_release(st);
  api->session_destroy(s);

  /* Its options are validated against its schema: a misspelt key, a value out of range. */
  make_pipeline(work, "name = \"c_inproc_step\"\ngama = 0.5\n");
  refused(&o, KILN_ERR_CONFIG, (const char* const[]){"inproc.toml:", "gama", NULL});
  make_pipeline(work, "name = \"c_inproc_step\"\ngamma = 1.5\n");
  refused(&o, KILN_ERR_CONFIG, (const char* const[]){"inproc.toml:", "gamma", NULL});

  /* Refused descriptors: PLUGIN_REFUSED naming the origin and the reason. */
  make_pipeline(work, "name = \"c_inproc_step\"\n");
  kiln_plugin_descriptor bad = good();
  const kiln_plugin_descriptor* const bad_one[] = {&bad};
  kiln_session_options ob = with(bad_one, 1);
  bad.struct_size = 8;
  refused(&ob, KILN_ERR_PLUGIN_REFUSED,
          (const char* const[]){"capi_inproc_test: plugin descriptor is 8 bytes", NULL});
  bad = good();
  bad.abi_major = KILN_ABI_MAJOR + 1;
  refused(&ob, KILN_ERR_PLUGIN_REFUSED,
          (const char* const[]){"capi_inproc_test: descriptor declares Kiln ABI", NULL});
  bad = good();
  bad.components = clashing;
  refused(&ob, KILN_ERR_PLUGIN_REFUSED,
          (const char* const[]){"capi_inproc_test: component 'constant' (lr_policy) is already "
                                "provided by ",
                                "libkiln_lr_schedules", NULL});
  /* A component descriptor too small, and a required slot NULL, as a library's. */
  kiln_component_descriptor small = component;
  const kiln_component_descriptor* const small_one[] = {&small};
  bad = good();
  bad.components = small_one;
  small.struct_size = 16;
  refused(&ob, KILN_ERR_PLUGIN_REFUSED,
          (const char* const[]){"capi_inproc_test: component #0 descriptor is 16 bytes", NULL});
  kiln_lr_policy_vtable holed = vtable;
  holed.lr_at = NULL;
  small = component;
  small.vtable = &holed;
  refused(&ob, KILN_ERR_PLUGIN_REFUSED,
          (const char* const[]){"required slot 'lr_at' is NULL", NULL});
  /* The same component twice, from two descriptors: the second names where the first came
   * from; the default origin when none is given. */
  const kiln_plugin_descriptor* const twice[] = {&d, &d};
  kiln_session_options ot = with(twice, 2);
  ot.component_origin = NULL;
  refused(&ot, KILN_ERR_PLUGIN_REFUSED,
          (const char* const[]){"<in-process>: component 'c_inproc_step' (lr_policy) is already "
                                "provided by <in-process>",
                                NULL});
  /* A NULL array with a count, and a NULL entry. */
  kiln_session_options on = with(NULL, 1);
  refused(&on, KILN_ERR_INVALID_ARGUMENT, (const char* const[]){"components is NULL", NULL});
  const kiln_plugin_descriptor* const null_one[] = {NULL};
  on = with(null_one, 1);
  refused(&on, KILN_ERR_PLUGIN_REFUSED,
          (const char* const[]){"capi_inproc_test: plugin descriptor is NULL", NULL});

  /* A caller with the version-1 struct: the components fields are past its struct_size, so
   * they are not read and the pipeline names an unknown policy. */
  kiln_session_options v1 = with(one, 1);
  v1.struct_size = KILN_SESSION_OPTIONS_V1_SIZE;
  refused(&v1, KILN_ERR_CONFIG, (const char* const[]){"c_inproc_step", NULL});
  CHECK(KILN_SESSION_OPTIONS_V2_SIZE == sizeof(kiln_session_options));

  /* No refused or failed session leaked an instance. */
  CHECK(destroy_calls == create_calls);
  if (failures == 0) printf("capi_inproc_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
