/* The C API's version-2 slots from plain C: where a configuration error points
 * (status_location), the session's tensors as DLPack views without copies (session_tensors,
 * tensor_list_*), weights loaded from DLPack tensors (session_load_tensors) with its refusals,
 * [ema]'s average (KILN_TENSORS_AVERAGE, kiln_metrics.weights), and a version-1 caller, who gets
 * version 1's table and trains as before. Usage: capi_v2_test <work dir> */
#include <dlpack/dlpack.h>
#include <kiln/kiln.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"

static char pipeline[4096];

/* 4 classes, 8x8 inputs, one hidden layer of 16: 4 parameters (two weights, two biases). */
static void make_pipeline(const char* work) {
  snprintf(pipeline, sizeof pipeline,
           "[run]\nepochs = 1\nseed = 3\nthreads = 1\ncheckpoints = false\n"
           "output_dir = \"%s/out\"\n"
           "[data]\ndataset = \"synthetic\"\nsynthetic_train = 256\nsynthetic_test = 128\n"
           "synthetic_classes = 4\nchannels = 1\nheight = 8\nwidth = 8\nbatch_size = 64\n"
           "[model]\nname = \"mlp\"\nhidden = [16]\n"
           "[optimizer]\nname = \"sgd\"\nlr = 0.1\nmomentum = 0.9\n"
           "[lr_policy]\nname = \"constant\"\n",
           work);
}

static kiln_session_options quiet(void) {
  kiln_session_options o;
  memset(&o, 0, sizeof o);
  o.struct_size = KILN_SESSION_OPTIONS_V1_SIZE;
  o.log_level = KILN_SESSION_LOG_WARN;
  return o;
}

static kiln_status_location location_of(const kiln_status* st, int32_t* located) {
  kiln_status_location l;
  memset(&l, 0, sizeof l);
  l.struct_size = sizeof l;
  *located = api->status_location(st, &l);
  return l;
}

static int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

static void release(DLManagedTensor* m) {
  if (m != NULL && m->deleter != NULL) m->deleter(m);
}

/* The index of `name` in the list, or -1. */
static long find(const kiln_tensor_list* list, const char* name) {
  for (size_t i = 0; i < api->tensor_list_count(list); ++i) {
    if (strcmp(api->tensor_list_name(list, i), name) == 0) return (long)i;
  }
  return -1;
}

static double eval_loss(kiln_session* s) {
  kiln_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  ok(api->session_evaluate(s, &m), "evaluate");
  return m.loss;
}

static void location_checks(const char* work) {
  kiln_session_options o = quiet();
  kiln_session* s = NULL;
  int32_t located = 0;

  /* A misspelt key in the text: its file (the name), line, column and key. */
  char broken[4200];
  snprintf(broken, sizeof broken, "%s", pipeline);
  char* run = strstr(broken, "epochs = 1");
  memcpy(run, "epochz", 6);
  kiln_status* st = api->session_create_from_string(broken, "loc.toml", &o, &s);
  CHECK(s == NULL && api->status_code(st) == KILN_ERR_CONFIG);
  kiln_status_location l = location_of(st, &located);
  CHECK(located == 1);
  CHECK(strcmp(l.file, "loc.toml") == 0 && l.line == 2 && l.column == 1);
  CHECK(strcmp(l.key, "run.epochz") == 0);
  CHECK(strstr(api->status_message(st), "loc.toml:2:1: run.epochz") != NULL);
  CHECK(strstr(api->status_message(st), "epochs") != NULL); /* the suggestion */
  /* A struct below its first size gets nothing; NULL gets nothing. */
  kiln_status_location small;
  small.struct_size = 8;
  small.file = "untouched";
  CHECK(api->status_location(st, &small) == 0 && strcmp(small.file, "untouched") == 0);
  CHECK(api->status_location(st, NULL) == 0);
  api->status_release(st);

  /* A TOML syntax error: its place, no key. */
  st = api->session_create_from_string("[run\nepochs = 1\n", "syntax.toml", &o, &s);
  CHECK(api->status_code(st) == KILN_ERR_CONFIG);
  l = location_of(st, &located);
  CHECK(located == 1 && strcmp(l.file, "syntax.toml") == 0 && l.line == 1 && l.column > 0);
  CHECK(strcmp(l.key, "") == 0);
  api->status_release(st);

  /* A bad override: "--set" and its key, no line. */
  const char* overrides[] = {"optimizer.lr=-1"};
  o.overrides = overrides;
  o.override_count = 1;
  st = api->session_create_from_string(pipeline, "over.toml", &o, &s);
  CHECK(api->status_code(st) == KILN_ERR_CONFIG);
  l = location_of(st, &located);
  CHECK(located == 1 && strcmp(l.file, "--set") == 0 && l.line == 0);
  CHECK(strcmp(l.key, "optimizer.lr") == 0);
  api->status_release(st);

  /* Statuses without a place: another code, and NULL. */
  st = api->session_create_from_string(NULL, "x", &o, &s);
  l = location_of(st, &located);
  CHECK(located == 0 && strcmp(l.file, "") == 0 && strcmp(l.key, "") == 0 && l.line == 0);
  api->status_release(st);
  l = location_of(NULL, &located);
  CHECK(located == 0);
  (void)work;
}

/* Inside the callback the tensor calls are refused (the step holds the training lock). */
static int32_t inside_codes[2];
static int32_t call_inside(void* session, const kiln_metrics* m) {
  kiln_tensor_list* list = NULL;
  kiln_status* st = api->session_tensors((kiln_session*)session, KILN_TENSORS_MODEL, &list);
  inside_codes[0] = api->status_code(st);
  api->status_release(st);
  st = api->session_load_tensors((kiln_session*)session, NULL, NULL, 0, KILN_LOAD_ALLOW_MISSING);
  inside_codes[1] = api->status_code(st);
  api->status_release(st);
  (void)m;
  return 0;
}

static void tensor_checks(void) {
  kiln_session_options o = quiet();
  kiln_session* s = NULL;
  ok(api->session_create_from_string(pipeline, "tensors", &o, &s), "create");

  kiln_tensor_list* list = NULL;
  kiln_status* st = api->session_tensors(s, 0, &list);
  CHECK(api->status_code(st) == KILN_ERR_INVALID_ARGUMENT && list == NULL);
  api->status_release(st);
  st = api->session_tensors(s, 16, &list);
  CHECK(api->status_code(st) == KILN_ERR_INVALID_ARGUMENT);
  api->status_release(st);

  /* Parameters: 2 weights and 2 biases, float32 on the CPU, owned views. */
  ok(api->session_tensors(s, KILN_TENSORS_PARAMETERS, &list), "session_tensors");
  const size_t n = api->tensor_list_count(list);
  CHECK(n == 4);
  CHECK(api->tensor_list_name(list, n) == NULL);
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    DLManagedTensor* m = NULL;
    ok(api->tensor_list_get(list, i, &m), "tensor_list_get");
    CHECK(m != NULL && m->dl_tensor.device.device_type == kDLCPU);
    CHECK(m->dl_tensor.dtype.code == kDLFloat && m->dl_tensor.dtype.bits == 32);
    total += numel(&m->dl_tensor);
    release(m);
  }
  CHECK(total == 64 * 16 + 16 + 16 * 4 + 4);
  DLManagedTensor* out_of_range = NULL;
  st = api->tensor_list_get(list, n, &out_of_range);
  CHECK(api->status_code(st) == KILN_ERR_INVALID_ARGUMENT && out_of_range == NULL);
  api->status_release(st);

  /* No copies: two views of one parameter share its data, and a view outlives the list. A
   * write through it is what the next fetch reads. */
  DLManagedTensor* a = NULL;
  DLManagedTensor* b = NULL;
  ok(api->tensor_list_get(list, 0, &a), "get a");
  const char* first_name = api->tensor_list_name(list, 0);
  char name0[256];
  snprintf(name0, sizeof name0, "%s", first_name);
  api->tensor_list_release(list);
  ok(api->session_tensors(s, KILN_TENSORS_MODEL, &list), "session_tensors again");
  CHECK(api->tensor_list_count(list) == 4); /* the MLP has no buffers */
  long i0 = find(list, name0);
  CHECK(i0 >= 0);
  ok(api->tensor_list_get(list, (size_t)i0, &b), "get b");
  CHECK(a->dl_tensor.data == b->dl_tensor.data);
  ((float*)a->dl_tensor.data)[0] = 12.5f;
  CHECK(((float*)b->dl_tensor.data)[0] == 12.5f);
  release(b);
  api->tensor_list_release(list);

  /* The optimizer's state: none before the first step, a momentum buffer per parameter after;
   * the step moved the parameter the old view still sees. */
  ok(api->session_tensors(s, KILN_TENSORS_OPTIMIZER, &list), "optimizer state");
  CHECK(api->tensor_list_count(list) == 0);
  api->tensor_list_release(list);
  ok(api->session_step(s), "step");
  CHECK(((float*)a->dl_tensor.data)[0] != 12.5f);
  ok(api->session_tensors(s, KILN_TENSORS_OPTIMIZER, &list), "optimizer state");
  CHECK(api->tensor_list_count(list) == 4);
  char slot[300];
  snprintf(slot, sizeof slot, "%s.momentum_buffer", name0);
  CHECK(find(list, slot) == 0); /* the model's order */
  api->tensor_list_release(list);

  /* Loading: every parameter zero gives uniform outputs, a test loss of ln(4). */
  ok(api->session_tensors(s, KILN_TENSORS_MODEL, &list), "session_tensors");
  const size_t count = api->tensor_list_count(list);
  const char* names[8];
  DLManagedTensor zeros[8]; /* the caller's own tensors: its data and shapes, no deleter */
  const DLManagedTensor* given[8];
  float* buffers[8];
  int64_t shapes[8][4];
  CHECK(count <= 8);
  for (size_t i = 0; i < count; ++i) {
    DLManagedTensor* m = NULL;
    ok(api->tensor_list_get(list, i, &m), "get");
    names[i] = api->tensor_list_name(list, i);
    memset(&zeros[i], 0, sizeof zeros[i]);
    zeros[i].dl_tensor = m->dl_tensor;
    for (int d = 0; d < m->dl_tensor.ndim && d < 4; ++d) shapes[i][d] = m->dl_tensor.shape[d];
    zeros[i].dl_tensor.shape = shapes[i];
    zeros[i].dl_tensor.strides = NULL;
    buffers[i] = calloc((size_t)numel(&m->dl_tensor), sizeof(float));
    zeros[i].dl_tensor.data = buffers[i];
    given[i] = &zeros[i];
    release(m);
  }
  double before = eval_loss(s);

  /* Refusals change nothing: a missing one, an unknown one, a shape, a dtype. */
  st = api->session_load_tensors(s, names, given, count - 1, 0);
  CHECK(api->status_code(st) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(st != NULL && strstr(api->status_message(st), names[count - 1]) != NULL);
  CHECK(st != NULL && strstr(api->status_message(st), "not given") != NULL);
  api->status_release(st);
  const char* saved_name = names[0];
  names[0] = "no.such.tensor";
  st = api->session_load_tensors(s, names, given, count, KILN_LOAD_ALLOW_MISSING);
  CHECK(api->status_code(st) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(st != NULL && strstr(api->status_message(st), "'no.such.tensor'") != NULL);
  api->status_release(st);
  names[0] = saved_name;
  int64_t wrong_shape[1] = {3};
  DLManagedTensor reshaped = zeros[0];
  reshaped.dl_tensor.ndim = 1;
  reshaped.dl_tensor.shape = wrong_shape;
  given[0] = &reshaped;
  st = api->session_load_tensors(s, names, given, count, 0);
  CHECK(api->status_code(st) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(st != NULL && strstr(api->status_message(st), "shape") != NULL &&
        strstr(api->status_message(st), names[0]) != NULL);
  api->status_release(st);
  DLManagedTensor ints = zeros[0];
  ints.dl_tensor.dtype.code = kDLInt;
  given[0] = &ints;
  st = api->session_load_tensors(s, names, given, count, 0);
  CHECK(api->status_code(st) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(st != NULL && strstr(api->status_message(st), "dtype") != NULL);
  api->status_release(st);
  given[0] = &zeros[0];
  CHECK(fabs(eval_loss(s) - before) < 1e-9);

  ok(api->session_load_tensors(s, names, given, count, 0), "load zeros");
  CHECK(fabs(eval_loss(s) - log(4.0)) < 1e-5);
  CHECK(((float*)a->dl_tensor.data)[0] == 0.0f); /* loaded in place */
  for (size_t i = 0; i < count; ++i) free(buffers[i]);
  api->tensor_list_release(list);

  /* Not inside the callback; a view outlives its session. */
  ok(api->session_set_metrics_callback(s, call_inside, s), "set callback");
  ok(api->session_step(s), "step with callback");
  CHECK(inside_codes[0] == KILN_ERR_FAILED_PRECONDITION);
  CHECK(inside_codes[1] == KILN_ERR_FAILED_PRECONDITION);
  api->session_destroy(s);
  CHECK(isfinite(((float*)a->dl_tensor.data)[0]));
  release(a);
}

/* Element 0 of the tensor `name` now (its list is taken afresh). */
static float first_value(kiln_session* s, uint32_t kinds, const char* name) {
  kiln_tensor_list* list = NULL;
  ok(api->session_tensors(s, kinds, &list), "session_tensors");
  const long i = find(list, name);
  CHECK(i >= 0);
  float v = NAN;
  DLManagedTensor* m = NULL;
  if (i >= 0 && api->tensor_list_get(list, (size_t)i, &m) == NULL)
    v = ((float*)m->dl_tensor.data)[0];
  release(m);
  api->tensor_list_release(list);
  return v;
}

/* [ema]'s average (KILN_TENSORS_AVERAGE, kiln_metrics.weights, "ema/" loads). */
static void average_checks(void) {
  kiln_session_options o = quiet();
  kiln_session* s = NULL;
  kiln_tensor_list* list = NULL;

  /* Without [ema]: the bit is refused as a precondition, an unknown bit as an argument, and an
   * evaluation measured the trained weights. A V3-sized struct keeps its own weights field. */
  ok(api->session_create_from_string(pipeline, "no-ema", &o, &s), "create");
  kiln_status* st = api->session_tensors(s, KILN_TENSORS_AVERAGE, &list);
  CHECK(api->status_code(st) == KILN_ERR_FAILED_PRECONDITION && list == NULL);
  CHECK(st != NULL && strstr(api->status_message(st), "[ema]") != NULL);
  api->status_release(st);
  st = api->session_tensors(s, 16, &list);
  CHECK(api->status_code(st) == KILN_ERR_INVALID_ARGUMENT);
  api->status_release(st);
  kiln_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  ok(api->session_evaluate(s, &m), "evaluate");
  CHECK(m.weights == KILN_WEIGHTS_TRAINED);
  memset(&m, 0, sizeof m);
  m.struct_size = KILN_METRICS_V3_SIZE;
  m.weights = -7;
  ok(api->session_evaluate(s, &m), "evaluate, V3 struct");
  CHECK(m.weights == -7 && isfinite(m.loss));
  api->session_destroy(s);

  /* With decay 0.5: step 1 copies the weights, step 2 moves halfway to them (timm's lerp). */
  char with_ema[sizeof pipeline + 64];
  snprintf(with_ema, sizeof with_ema, "%s[ema]\ndecay = 0.5\n", pipeline);
  ok(api->session_create_from_string(with_ema, "ema", &o, &s), "create with [ema]");
  ok(api->session_tensors(s, KILN_TENSORS_PARAMETERS | KILN_TENSORS_AVERAGE, &list), "both");
  const size_t n = api->tensor_list_count(list);
  CHECK(n == 8); /* 4 parameters, then their averages */
  char name[256], averaged[300];
  snprintf(name, sizeof name, "%s", api->tensor_list_name(list, 3)); /* head.bias: it moves */
  snprintf(averaged, sizeof averaged, "ema/%s", name);
  CHECK(find(list, averaged) == 7);
  api->tensor_list_release(list);
  ok(api->session_step(s), "step 1");
  const float w1 = first_value(s, KILN_TENSORS_PARAMETERS, name);
  CHECK(first_value(s, KILN_TENSORS_AVERAGE, averaged) == w1);
  ok(api->session_step(s), "step 2");
  const float w2 = first_value(s, KILN_TENSORS_PARAMETERS, name);
  CHECK(w2 != w1);
  CHECK(fabsf(first_value(s, KILN_TENSORS_AVERAGE, averaged) - (w1 + 0.5f * (w2 - w1))) < 1e-6f);
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  ok(api->session_evaluate(s, &m), "evaluate the average");
  CHECK(m.weights == KILN_WEIGHTS_AVERAGE);
  CHECK(first_value(s, KILN_TENSORS_PARAMETERS, name) == w2); /* trained weights put back */

  /* Loading a zero average (names given only as "ema/..."): the evaluation measures it, ln(4);
   * the trained weights stay. Model tensors alone load strictly without the average. */
  ok(api->session_tensors(s, KILN_TENSORS_AVERAGE, &list), "average");
  const size_t count = api->tensor_list_count(list);
  const char* names[8];
  DLManagedTensor zeros[8];
  const DLManagedTensor* given[8];
  float* buffers[8];
  CHECK(count == 4);
  for (size_t i = 0; i < count && i < 8; ++i) {
    DLManagedTensor* t = NULL;
    ok(api->tensor_list_get(list, i, &t), "get");
    names[i] = api->tensor_list_name(list, i);
    zeros[i] = *t;
    zeros[i].deleter = NULL;
    buffers[i] = calloc((size_t)numel(&t->dl_tensor), sizeof(float));
    zeros[i].dl_tensor.data = buffers[i];
    zeros[i].dl_tensor.byte_offset = 0;
    given[i] = &zeros[i];
    ok(api->session_load_tensors(s, &names[i], &given[i], 1, KILN_LOAD_ALLOW_MISSING), "one");
    release(t); /* after the load: zeros[i] borrowed its shape */
  }
  CHECK(fabs(eval_loss(s) - log(4.0)) < 1e-5);
  CHECK(first_value(s, KILN_TENSORS_PARAMETERS, name) == w2);
  CHECK(first_value(s, KILN_TENSORS_AVERAGE, averaged) == 0.0f);
  for (size_t i = 0; i < count && i < 8; ++i) free(buffers[i]);
  api->tensor_list_release(list);
  ok(api->session_tensors(s, KILN_TENSORS_MODEL, &list), "model");
  const size_t model_count = api->tensor_list_count(list);
  DLManagedTensor* views[8];
  const DLManagedTensor* model[8];
  for (size_t i = 0; i < model_count && i < 8; ++i) {
    ok(api->tensor_list_get(list, i, &views[i]), "get");
    names[i] = api->tensor_list_name(list, i);
    model[i] = views[i];
  }
  ok(api->session_load_tensors(s, names, model, model_count, 0), "strict without the average");
  for (size_t i = 0; i < model_count && i < 8; ++i) release(views[i]);
  api->tensor_list_release(list);
  api->session_destroy(s);
}

static void v1_caller(void) {
  const kiln_api* v1 = kiln_get_api(1);
  CHECK(v1 != NULL && v1->version == 1 && v1->struct_size == KILN_API_V1_SIZE);
  if (v1 == NULL) return;
  kiln_session_options o = quiet();
  kiln_session* s = NULL;
  kiln_status* st = v1->session_create_from_string(pipeline, "v1", &o, &s);
  CHECK(st == NULL);
  if (st != NULL) {
    fprintf(stderr, "v1 create: %s\n", v1->status_message(st));
    v1->status_release(st);
    return;
  }
  CHECK(v1->session_step(s) == NULL);
  kiln_progress p;
  memset(&p, 0, sizeof p);
  p.struct_size = KILN_PROGRESS_V1_SIZE;
  CHECK(v1->session_progress(s, &p) == NULL && p.step == 1);
  v1->session_destroy(s);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: capi_v2_test <work dir>\n");
    return 2;
  }
  mkdir(argv[1], 0755);
  api = kiln_get_api(2);
  CHECK(api != NULL);
  if (api == NULL) return 1;
  CHECK(api->version == 2 && api->struct_size == KILN_API_V2_SIZE);
  CHECK(KILN_HAS_FIELD(api, kiln_api, session_load_tensors));
  make_pipeline(argv[1]);
  location_checks(argv[1]);
  tensor_checks();
  average_checks();
  v1_caller();
  if (failures == 0) printf("capi_v2_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
