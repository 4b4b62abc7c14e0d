/* The C API from plain C, as a program in another language sees it: only kiln/kiln.h and
 * libkiln, no LibTorch. Trains a small synthetic pipeline step by step and through run, checks
 * statuses, struct-size refusals, the callback, cancel from another thread, and plugin queries.
 * Usage: capi_test <source dir> <work dir> */
#define _POSIX_C_SOURCE 200809L /* nanosleep, pthreads under -std=c99 */
#include <kiln/kiln.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "check.h"

static char pipeline[4096];

static void make_pipeline(const char* work, int epochs) {
  snprintf(pipeline, sizeof pipeline,
           "[run]\nepochs = %d\nseed = 3\nthreads = 1\noutput_dir = \"%s/out\"\n"
           "[data]\ndataset = \"synthetic\"\nsynthetic_train = 512\nsynthetic_test = 256\n"
           "synthetic_classes = 4\nchannels = 1\nheight = 8\nwidth = 8\nbatch_size = 64\n"
           "[model]\nname = \"mlp\"\nhidden = [32]\n"
           "[optimizer]\nname = \"sgd\"\nlr = 0.1\nmomentum = 0.9\n"
           "[lr_policy]\nname = \"constant\"\n",
           epochs, work);
}

static kiln_session_options quiet(void) {
  kiln_session_options o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.log_level = KILN_SESSION_LOG_WARN;
  return o;
}

static kiln_progress progress_of(kiln_session* s) {
  kiln_progress p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  ok(api->session_progress(s, &p), "session_progress");
  return p;
}

static int steps_seen;
static int32_t count_steps(void* user_data, const kiln_metrics* m) {
  int stop_after = *(const int*)user_data;
  if (m->kind == KILN_METRICS_STEP) ++steps_seen;
  return stop_after > 0 && steps_seen >= stop_after;
}

static void* cancel_later(void* session) {
  const struct timespec delay = {0, 300 * 1000 * 1000};
  nanosleep(&delay, NULL);
  api->session_cancel((kiln_session*)session);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: capi_test <source dir> <work dir> <test plugin dir>\n");
    return 2;
  }
  const char* work = argv[2];
  mkdir(work, 0755);

  api = kiln_get_api(KILN_CAPI_VERSION);
  CHECK(api != NULL);
  if (api == NULL) return 1;
  CHECK(kiln_get_api(KILN_CAPI_VERSION + 1) == NULL);
  CHECK(api->struct_size >= KILN_API_V1_SIZE && api->version == KILN_CAPI_VERSION);
  CHECK(strstr(api->version_string(), "C API 2") != NULL);
  uint32_t major = 0, minor = 0;
  api->plugin_abi(&major, &minor);
  CHECK(major == KILN_ABI_MAJOR && minor == KILN_ABI_MINOR);

  /* Plugins: the built-in ones are found beside libkiln. */
  kiln_plugin_list* list = NULL;
  ok(api->plugins_list(NULL, 0, &list), "plugins_list");
  int found_sgd = 0;
  for (size_t i = 0; i < api->plugins_count(list); ++i) {
    kiln_plugin_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    ok(api->plugins_get(list, i, &info), "plugins_get");
    if (strcmp(info.name, "sgd") == 0) found_sgd = strcmp(info.kind, "optimizer") == 0;
  }
  CHECK(found_sgd);
  CHECK(api->plugins_refused_count(list) == 0);
  kiln_plugin_info bad;
  bad.struct_size = 8; /* below the v1 size: refused, not overrun */
  kiln_status* st = api->plugins_get(list, 0, &bad);
  CHECK(api->status_code(st) == KILN_ERR_INVALID_ARGUMENT);
  api->status_release(st);
  api->plugins_release(list);

  /* A library whose init throws (C++ `throw 42`) is listed as refused, with its path and the
   * exception; the built-in plugins are still there and nothing crosses the C API. */
  {
    char throwing[4096];
    snprintf(throwing, sizeof throwing, "%s/throwing_init", argv[3]);
    const char* dirs[] = {throwing};
    kiln_plugin_list* with_bad = NULL;
    ok(api->plugins_list(dirs, 1, &with_bad), "plugins_list with a throwing init");
    CHECK(api->plugins_refused_count(with_bad) == 1);
    const char* why = api->plugins_refused(with_bad, 0);
    CHECK(why != NULL && strstr(why, "libthrowing_init.so: init threw int") != NULL);
    CHECK(api->plugins_count(with_bad) > 0);
    api->plugins_release(with_bad);
  }

  /* A misspelt key: KILN_ERR_CONFIG naming line:column and the nearest key. */
  kiln_session_options o = quiet();
  kiln_session* s = NULL;
  make_pipeline(work, 1);
  char broken[4200];
  snprintf(broken, sizeof broken, "%s[memory]\nchekpoint = \"none\"\n", pipeline);
  st = api->session_create_from_string(broken, "broken.toml", &o, &s);
  CHECK(s == NULL);
  CHECK(api->status_code(st) == KILN_ERR_CONFIG);
  CHECK(strstr(api->status_message(st), "broken.toml:") != NULL);
  CHECK(strstr(api->status_message(st), "checkpoint") != NULL);
  api->status_release(st);
  st = api->session_create_from_file("/nonexistent/pipeline.toml", &o, &s);
  CHECK(st != NULL && s == NULL);
  api->status_release(st);
  CHECK(api->session_create_from_string(NULL, "x", &o, &s) != NULL); /* leaks nothing to check */

  /* A NULL array with a count, or a NULL entry, is the caller's mistake. */
  {
    make_pipeline(work, 1);
    kiln_session_options bad_o = quiet();
    bad_o.overrides = NULL;
    bad_o.override_count = 1;
    st = api->session_create_from_string(pipeline, "x", &bad_o, &s);
    CHECK(s == NULL && api->status_code(st) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(st != NULL && strstr(api->status_message(st), "overrides") != NULL);
    api->status_release(st);
    const char* with_null[] = {"optimizer.lr=0.05", NULL};
    bad_o.overrides = with_null;
    bad_o.override_count = 2;
    st = api->session_create_from_string(pipeline, "x", &bad_o, &s);
    CHECK(s == NULL && api->status_code(st) == KILN_ERR_INVALID_ARGUMENT);
    api->status_release(st);
    bad_o.overrides = NULL;
    bad_o.override_count = 0;
    bad_o.plugin_paths = NULL;
    bad_o.plugin_path_count = 2;
    st = api->session_create_from_string(pipeline, "x", &bad_o, &s);
    CHECK(s == NULL && api->status_code(st) == KILN_ERR_INVALID_ARGUMENT);
    api->status_release(st);
  }

  /* Step by step: 512 / 64 = 8 steps per epoch, 2 epochs. */
  make_pipeline(work, 2);
  /* checkpoint_every = 8 writes the checkpoint at epoch 1's last step, before the epoch closes:
   * the resume below starts from it. */
  const char* overrides[] = {"optimizer.lr=0.05", "run.checkpoint_every=8"};
  o.overrides = overrides;
  o.override_count = 2;
  ok(api->session_create_from_string(pipeline, "steps", &o, &s), "create");
  kiln_progress p = progress_of(s);
  CHECK(p.state == KILN_SESSION_READY && p.step == 0 && p.max_steps == 16);
  CHECK(p.batches_per_epoch == 8 && p.epochs == 2 && p.world_size == 1);
  kiln_metrics first;
  memset(&first, 0, sizeof first);
  first.struct_size = sizeof first;
  ok(api->session_evaluate(s, &first), "evaluate");
  CHECK(first.kind == KILN_METRICS_EVAL && first.accuracy >= 0.0 && first.accuracy <= 1.0);
  /* V2: top-5, at least top-1; a V1 caller's struct ends before it and gets nothing there. */
  CHECK(first.accuracy_top5 >= first.accuracy && first.accuracy_top5 <= 1.0);
  kiln_metrics v1;
  memset(&v1, 0, sizeof v1);
  v1.struct_size = KILN_METRICS_V1_SIZE;
  v1.accuracy_top5 = -7.0;
  ok(api->session_last_metrics(s, KILN_METRICS_EVAL, &v1), "last_metrics v1");
  CHECK(v1.kind == KILN_METRICS_EVAL && v1.accuracy == first.accuracy && v1.accuracy_top5 == -7.0);
  for (int i = 1; i <= 8; ++i) {
    ok(api->session_step(s), "step");
    p = progress_of(s);
    CHECK(p.step == i);
    CHECK(p.epoch_ended == (i == 8));
  }
  kiln_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  ok(api->session_last_metrics(s, KILN_METRICS_STEP, &m), "last_metrics");
  CHECK(m.kind == KILN_METRICS_STEP && m.step == 8 && m.epoch == 1 && isfinite(m.loss));
  CHECK(fabs(m.lr - 0.05) < 1e-12); /* the override applied */
  kiln_metrics after;
  memset(&after, 0, sizeof after);
  after.struct_size = sizeof after;
  ok(api->session_evaluate(s, &after), "evaluate");
  CHECK(after.epoch == 1);
  CHECK(after.accuracy > first.accuracy + 0.2); /* it learnt */
  const char* folder = NULL;
  ok(api->session_save_checkpoint(s, &folder), "save_checkpoint");
  struct stat sb;
  CHECK(folder != NULL && stat(folder, &sb) == 0 && S_ISDIR(sb.st_mode));
  char saved[2048];
  snprintf(saved, sizeof saved, "%s", folder != NULL ? folder : "");
  ok(api->session_run(s), "run");
  p = progress_of(s);
  CHECK(p.state == KILN_SESSION_FINISHED && p.step == 16);
  st = api->session_step(s);
  CHECK(api->status_code(st) == KILN_ERR_FAILED_PRECONDITION);
  api->status_release(st);
  api->session_destroy(s);

  /* Resumed from the checkpoint taken at epoch 1's last step: the epoch has ended, and the next
   * step is step 9, the first of epoch 2 (not a step that finds the epoch empty). */
  o.resume = saved;
  ok(api->session_create_from_string(pipeline, "steps", &o, &s), "create (resume)");
  p = progress_of(s);
  CHECK(p.state == KILN_SESSION_READY && p.step == 8 && p.epoch_ended);
  ok(api->session_step(s), "step after resume");
  p = progress_of(s);
  CHECK(p.step == 9 && p.epoch == 2 && !p.epoch_ended);
  api->session_destroy(s);
  o.resume = NULL;

  /* The callback's nonzero return cancels after that step. */
  o.override_count = 0;
  ok(api->session_create_from_string(pipeline, "callback", &o, &s), "create");
  int stop_after = 5;
  steps_seen = 0;
  ok(api->session_set_metrics_callback(s, count_steps, &stop_after), "set callback");
  ok(api->session_run(s), "run");
  p = progress_of(s);
  CHECK(p.state == KILN_SESSION_CANCELLED && p.step == 5 && steps_seen == 5);
  CHECK(strcmp(p.stop_reason, "cancelled") == 0);
  api->session_destroy(s);

  /* Cancel from another thread while run() trains (a long run that would take minutes). */
  make_pipeline(work, 5000);
  ok(api->session_create_from_string(pipeline, "cancel", &o, &s), "create");
  pthread_t thread;
  pthread_create(&thread, NULL, cancel_later, s);
  ok(api->session_run(s), "run");
  pthread_join(thread, NULL);
  p = progress_of(s);
  CHECK(p.state == KILN_SESSION_CANCELLED && p.step > 0 && p.step < p.max_steps);
  CHECK(p.last_checkpoint[0] != '\0' && stat(p.last_checkpoint, &sb) == 0);
  api->session_destroy(s);

  api->session_destroy(NULL);
  api->status_release(NULL);
  if (failures == 0) printf("capi_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
