/*
 * kiln/kiln.h — the C API of libkiln: drive Kiln training from any language that can call C.
 *
 * ENTRY POINT
 *  libkiln exports one function, kiln_get_api(version). It returns a table of function pointers
 *  (kiln_api) for that version of this API, or NULL when the library does not provide it. Every
 *  other function is reached through the table, so a program binds to one symbol only.
 *
 * VERSIONING
 *  - KILN_CAPI_VERSION is this API's version, an integer. A library serves every version from 1
 *    up to its own; a newer table only appends slots (and kiln_api.struct_size says how many the
 *    library filled). A slot removed or retyped would need a new major library (libkiln.so.N).
 *  - Structs the caller fills or reads begin with `size_t struct_size`: the caller sets it to
 *    sizeof(the struct as it knows it); the library reads and writes only the fields inside it,
 *    so an older caller with a shorter struct keeps working. A struct_size smaller than the
 *    struct's version-1 size (KILN_*_V1_SIZE) is refused with KILN_ERR_INVALID_ARGUMENT.
 *  - The plugin ABI (kiln/abi.h, KILN_ABI_MAJOR/MINOR) is versioned on its own; plugin_abi
 *    reports the one the library was built with.
 *  - Version 2 appends status_location (where a configuration error points) and the session's
 *    tensors as DLPack (session_tensors, tensor_list_*, session_load_tensors). A caller of
 *    kiln_get_api(1) gets a table of KILN_API_V1_SIZE and never sees them.
 *
 * ERRORS
 *  A function returning kiln_status* returns NULL on success, or a status the CALLER owns and
 *  frees with kiln_api.status_release. Codes are kiln/abi.h's KILN_ERR_* plus the KILN_ERR_*
 *  below. No C++ exception ever leaves the library; an unexpected one becomes KILN_ERR_INTERNAL.
 *  Pointer arguments must not be NULL unless a field says "may be NULL"; a NULL one is reported
 *  as KILN_ERR_INVALID_ARGUMENT.
 *
 * OWNERSHIP (every pointer says which of these applies)
 *  - borrowed: the library reads it during the call only and keeps no reference;
 *  - caller-owned out: the caller allocated it, the library fills it;
 *  - library-owned: valid until the event stated beside it; never freed by the caller.
 *
 * THREADS
 *  - version, plugin_abi, the status_* functions and the plugins_* functions may be called from
 *    any thread at any time.
 *  - Calls that create, train, evaluate, checkpoint or destroy sessions are serialized by one
 *    process-wide lock (LibTorch's random generators are per process): they may come from any
 *    thread, and two sessions may live at once, but their calls run one after another. Each
 *    session keeps its own state of LibTorch's CPU random generator, put in place for its calls
 *    and taken back after, so two one-process sessions on the CPU stepping in turn each train
 *    as they would alone.
 *  - session_progress and session_last_metrics do not take that lock: they may be called from
 *    any thread while another thread trains, and see the state after the latest whole step.
 *  - session_cancel may be called from any thread (not from a signal handler) at any time
 *    while the session exists.
 *  - The metrics callback runs on the thread that called session_step/run/evaluate. Inside it,
 *    only session_progress, session_last_metrics and session_cancel may be called on its
 *    session; any other session call returns KILN_ERR_FAILED_PRECONDITION.
 *  - The tensor_list_* functions may be called from any thread; the tensors they hand out are
 *    the training's own, so reading or writing them while another thread steps the session
 *    races with that step.
 *
 * PROCESS-WIDE SETTINGS, SIGNALS AND LOGS
 *  A session changes nothing in the process that loaded libkiln unless its options ask
 *  (kiln_session_options.process_settings, KILN_PROCESS_*): c10's CPU allocator, malloc's
 *  tuning, torch's threads and flags and the signal handlers stay as the program set them.
 *  Without KILN_PROCESS_SIGNALS a session installs no signal handlers (the program owns them;
 *  call session_cancel from its handler thread instead). Kiln logs to stderr;
 *  kiln_session_options.log_level sets how much.
 */
#ifndef KILN_KILN_H_
#define KILN_KILN_H_

#include "kiln/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_CAPI_VERSION 2

/* Status codes of this API, in addition to kiln/abi.h's KILN_ERR_* (int32_t). */
enum {
  KILN_ERR_CONFIG = 16,         /* the pipeline is invalid; the message names file:line:column
                                   and the key, and suggests the nearest valid key */
  KILN_ERR_PLUGIN_REFUSED = 17, /* a plugin library was refused, or a dataset plugin broke its
                                   contract; the message has its path and the reason */
  KILN_ERR_RUN_FAILED = 18      /* building or training failed (an unreadable sample, a
                                   component, I/O, a collective); a session it happened to is
                                   in KILN_SESSION_FAILED and can only be destroyed */
};

/* A training session: one resolved pipeline, its plugins, model, optimizer and data. Opaque;
 * created by session_create_*, destroyed by session_destroy. */
typedef struct kiln_session kiln_session;

/* The plugins found in a set of folders. Opaque; created by plugins_list, freed by
 * plugins_release. */
typedef struct kiln_plugin_list kiln_plugin_list;

/* Log levels (kiln_session_options.log_level, int32_t). */
enum {
  KILN_SESSION_LOG_DEFAULT = 0, /* leave the level as it is (info, unless set before) */
  KILN_SESSION_LOG_DEBUG = 1,
  KILN_SESSION_LOG_INFO = 2,
  KILN_SESSION_LOG_WARN = 3,
  KILN_SESSION_LOG_ERROR = 4,
  KILN_SESSION_LOG_OFF = 5
};

/* kiln/plugin.h's descriptor, named by kiln_session_options.components. */
struct kiln_plugin_descriptor;

/* How a session is made. Zero-fill it, then set struct_size and what you need. */
typedef struct kiln_session_options {
  size_t struct_size;              /* sizeof(kiln_session_options) as the caller knows it */
  const char* const* overrides;    /* borrowed: "dotted.key=value" strings, as `kiln run --set`
                                      (the value is TOML; a bare word is taken as a string);
                                      may be NULL when override_count is 0 */
  size_t override_count;           /* entries in overrides */
  const char* const* plugin_paths; /* borrowed: extra plugin folders, searched after the
                                      built-in one and KILN_PLUGIN_PATH; may be NULL */
  size_t plugin_path_count;        /* entries in plugin_paths */
  const char* metrics_path;        /* borrowed: write metrics as JSON lines to this file (as
                                      `kiln run --metrics`); NULL or "": none */
  const char* resume;              /* borrowed: "auto" (the newest usable checkpoint of the
                                      newest run folder <output_dir>/version_N that has one) or
                                      a checkpoint folder; NULL or "": start afresh, in a new
                                      run folder */
  int32_t log_level;               /* KILN_SESSION_LOG_*; applies to the whole process */
  int32_t distributed;             /* nonzero: join the data-parallel run the environment
                                      describes (torchrun's or Slurm's variables, or `kiln
                                      launch`); zero: one process, whatever the environment */
  uint32_t process_settings;       /* appended (read only when struct_size covers it):
                                      KILN_PROCESS_* bits, what the session may change in the
                                      whole process; 0: nothing (see PROCESS-WIDE SETTINGS) */
  /* Since V2 (read only when struct_size covers them; see IN-PROCESS COMPONENTS below): */
  const struct kiln_plugin_descriptor* const* components; /* borrowed for the SESSION'S LIFE
                                      (until session_destroy returns): plugin descriptors
                                      (kiln/plugin.h) whose functions live in the program, as
                                      kiln_plugin_get would return them; the array itself is
                                      read during the create call only; may be NULL when
                                      component_count is 0 */
  size_t component_count;                                 /* entries in components */
  const char* component_origin; /* borrowed: stands for a library path in messages and
                                   plugin lists ("my_app.py"); NULL or "": "<in-process>" */
} kiln_session_options;
#define KILN_SESSION_OPTIONS_V1_SIZE KILN_SIZE_UP_TO(kiln_session_options, distributed)
#define KILN_SESSION_OPTIONS_V2_SIZE KILN_SIZE_UP_TO(kiln_session_options, component_origin)

/* IN-PROCESS COMPONENTS (kiln_session_options.components)
 *  A program registers optimizers, LR policies (or any other kind) whose functions it holds
 *  itself, with no plugin library: each entry is the kiln_plugin_descriptor a library's
 *  kiln_plugin_get would return, with its component descriptors, vtables, capabilities and
 *  option schemas. The session validates each exactly as a library's (ABI version, struct
 *  sizes, component kinds, required slots, option schemas, capabilities, reserved fields, the
 *  recorded LibTorch) and refuses a component whose name a loaded plugin, or an earlier
 *  descriptor, already uses; a refusal is KILN_ERR_PLUGIN_REFUSED with "<origin>: <reason>".
 *  Then the descriptor's init (if any) is called, once per session created with it, and the
 *  pipeline names the components like any plugin's; their options are validated against their
 *  schemas (a misspelt key is KILN_ERR_CONFIG). The components exist for that session only.
 *  Everything the descriptors point to (names, schemas, vtables and what their functions use)
 *  must stay valid and unchanged until session_destroy returns. Their functions are called on
 *  the thread of the session call that needs them (an LR policy's lr_at on the training thread,
 *  under the session lock) and must not throw or unwind through the library: a failure is a
 *  returned status (made with the kiln_host_api passed to init and create), which fails the
 *  call as a plugin's would. */

/* What a session may change in the whole process (kiln_session_options.process_settings, bits).
 * `kiln run` makes all of them; a session makes none unless asked. */
enum {
  /* c10's CPU allocator becomes Kiln's counting one before the session's tensors, so that the
   * metrics' tensor_mb, tensor_peak_mb and activation_mb are known on the CPU (without it they
   * are NaN there, unless another session installed it). It stays for the life of the process. */
  KILN_PROCESS_COUNT_CPU_MEMORY = 1,
  /* The pipeline's run.threads, run.tf32 and run.cudnn_benchmark are applied to torch's global
   * context (without it they are left as the program set them, and a set run.threads or
   * run.tf32 is logged as not applied). They stay after the session. */
  KILN_PROCESS_TORCH_SETTINGS = 2,
  /* glibc's malloc thresholds are tuned for training (mallopt) once the session is built, unless
   * the environment sets any MALLOC_*_ or GLIBC_TUNABLES. They stay after the session. */
  KILN_PROCESS_TUNE_HEAP = 4,
  /* SIGINT and SIGTERM stop the session after a whole step, with its checkpoint, as they stop
   * `kiln run` (a second one exits at once); the program's handlers are put back at
   * session_destroy. One session at a time: another asking while it lives is refused
   * (KILN_ERR_FAILED_PRECONDITION). */
  KILN_PROCESS_SIGNALS = 8,
  KILN_PROCESS_ALL = 15 /* all of the above, as `kiln run` */
};

/* Where a session is (kiln_progress.state, int32_t). */
enum {
  KILN_SESSION_READY = 0,     /* more steps to take */
  KILN_SESSION_FINISHED = 1,  /* every step of run.epochs / run.max_steps is done */
  KILN_SESSION_CANCELLED = 2, /* session_cancel, a callback's nonzero return or
                                 run.early_stop_patience stopped it after a whole step; the
                                 checkpoint of that step was written when checkpoints are on */
  KILN_SESSION_STOPPED = 3,   /* a guard stopped it (e.g. too many non-finite steps); the reason
                                 is in kiln_progress.stop_reason, the weights were saved */
  KILN_SESSION_FAILED = 4     /* a call returned KILN_ERR_RUN_FAILED; destroy it */
};

/* Where training stands. Caller-owned out struct; set struct_size before the call. */
typedef struct kiln_progress {
  size_t struct_size;          /* sizeof(kiln_progress) as the caller knows it */
  int32_t state;               /* KILN_SESSION_* */
  int32_t epoch_ended;         /* nonzero: the latest step was the last of its epoch */
  int64_t step;                /* optimizer steps taken (applied and skipped), over resumes */
  int64_t max_steps;           /* steps the whole run takes */
  int64_t epoch;               /* the epoch of the latest step (1-based; 0 before any) */
  int64_t epochs;              /* run.epochs */
  int64_t batches_in_epoch;    /* batches of that epoch consumed so far */
  int64_t batches_per_epoch;   /* batches per epoch on this rank */
  int32_t rank;                /* this process's rank (0 in a one-process run) */
  int32_t world_size;          /* ranks in the run (1 in a one-process run) */
  const char* stop_reason;     /* library-owned, valid until session_destroy: why the session
                                  stopped ("" unless STOPPED or CANCELLED) */
  const char* last_checkpoint; /* library-owned, valid until session_destroy: the newest
                                  checkpoint folder the session wrote, or "" */
} kiln_progress;
#define KILN_PROGRESS_V1_SIZE KILN_SIZE_UP_TO(kiln_progress, last_checkpoint)

/* Kinds of metrics record (kiln_metrics.kind, int32_t). */
enum {
  KILN_METRICS_STEP = 1, /* one optimizer step */
  KILN_METRICS_EVAL = 2  /* one evaluation on the test split */
};

/* One metrics record, as `kiln run --metrics` writes per line. Fields that do not apply to the
 * kind are NaN (doubles) or 0 (integers). In a data-parallel run, loss and accuracy are over
 * all ranks. */
typedef struct kiln_metrics {
  size_t struct_size;        /* sizeof(kiln_metrics) as the caller knows it */
  int32_t kind;              /* KILN_METRICS_*; 0 when no such record exists yet */
  int32_t skipped;           /* step: nonzero when non-finite gradients skipped the update */
  int64_t step;              /* optimizer steps taken when the record was made (1-based) */
  int64_t epoch;             /* the record's epoch (1-based) */
  double loss;               /* step: mean training loss of the step; eval: mean test loss */
  double accuracy;           /* eval: test accuracy in [0, 1] */
  double lr;                 /* step: the first parameter group's learning rate */
  double grad_norm;          /* step: global norm of the unscaled gradients, before clipping;
                                NaN on a step that ran no gradient pass (run.grad_check) */
  double loss_scale;         /* step: the scale this step's loss was multiplied by */
  double step_seconds;       /* step: forward, backward and optimizer time */
  double data_seconds;       /* step: time spent waiting for batches */
  double samples_per_second; /* step: samples of all ranks / (step + data time) */
  double tensor_mb;          /* step: tensor memory live at the end of the step, MiB */
  double tensor_peak_mb;     /* step: the step's peak tensor memory, MiB */
  double activation_mb;      /* step: that peak above what was live when the step began, MiB */
  /* Since V2 (filled only when the caller's struct_size covers it): */
  double accuracy_top5; /* eval: top-5 test accuracy in [0, 1] (top-min(5, classes)) */
  /* Since V3 (filled only when the caller's struct_size covers it): */
  double map; /* eval of multi-label data: mean average precision in [0, 1], the accuracies
                 then NaN; NaN for data of one class per sample */
  /* Since V4 (filled only when the caller's struct_size covers it): */
  int32_t weights; /* eval: which weights were measured, KILN_WEIGHTS_*; 0 on step records,
                      and left as the caller set it by a library older than V4 */
} kiln_metrics;
#define KILN_METRICS_V1_SIZE KILN_SIZE_UP_TO(kiln_metrics, activation_mb)
#define KILN_METRICS_V2_SIZE KILN_SIZE_UP_TO(kiln_metrics, accuracy_top5)
#define KILN_METRICS_V3_SIZE KILN_SIZE_UP_TO(kiln_metrics, map)
#define KILN_METRICS_V4_SIZE KILN_SIZE_UP_TO(kiln_metrics, weights)

/* Which weights an evaluation measured (kiln_metrics.weights, int32_t). */
enum {
  KILN_WEIGHTS_TRAINED = 1, /* the trained weights */
  KILN_WEIGHTS_AVERAGE = 2  /* [ema]'s moving average (ema.evaluate) */
};

/* Called after every step and every evaluation with the new record (borrowed: valid during the
 * call). Return 0 to go on, nonzero to stop the session, as session_cancel: after this step
 * (after an evaluation: before the next step). In a data-parallel run the ranks agree on it
 * through the next step's all-reduce, so they all stop after that one. */
typedef int32_t (*kiln_metrics_callback)(void* user_data, const kiln_metrics* metrics);

/* One component of a loaded plugin library. Library-owned strings, valid until
 * plugins_release of the list it came from. */
typedef struct kiln_plugin_info {
  size_t struct_size;   /* sizeof(kiln_plugin_info) as the caller knows it */
  const char* name;     /* the component's name, as a pipeline names it ("sgd") */
  const char* kind;     /* "optimizer", "lr_policy", "norm", "precision", "model" or "dataset" */
  const char* summary;  /* one line, or "" */
  const char* library;  /* path of the plugin library */
  kiln_version version; /* the component's version */
  uint32_t abi_major;   /* plugin ABI the library was built with */
  uint32_t abi_minor;
} kiln_plugin_info;
#define KILN_PLUGIN_INFO_V1_SIZE KILN_SIZE_UP_TO(kiln_plugin_info, abi_minor)

/* ---- version 2 ---- */

/* Where a configuration error points (status_location). Caller-owned out struct; set
 * struct_size before the call. */
typedef struct kiln_status_location {
  size_t struct_size; /* sizeof(kiln_status_location) as the caller knows it */
  const char* file;   /* owned by the status, valid until status_release: the pipeline file as
                         given (session_create_from_string's name for TOML text), "--set" for an
                         override; "" when unknown */
  int64_t line;       /* 1-based; 0 when the error is not at a place in the file (an override, a
                         default, a file that cannot be read) */
  int64_t column;     /* 1-based; 0 when line is 0 */
  const char* key;    /* owned by the status, valid until status_release: the dotted key the
                         error is about ("run.epochz"), or "" (a TOML syntax error) */
} kiln_status_location;
#define KILN_STATUS_LOCATION_V1_SIZE KILN_SIZE_UP_TO(kiln_status_location, key)

/* dlpack/dlpack.h's managed tensor (the unversioned DLPack 0.x/1.x struct, "dltensor"
 * capsules): include <dlpack/dlpack.h> to read one. */
struct DLManagedTensor;

/* Named tensors of a session, taken by session_tensors. Opaque; freed by tensor_list_release. */
typedef struct kiln_tensor_list kiln_tensor_list;

/* Which tensors session_tensors takes (bits, uint32_t). */
enum {
  KILN_TENSORS_PARAMETERS = 1, /* the model's parameters, by state_dict name ("fc1.weight") */
  KILN_TENSORS_BUFFERS = 2,    /* the model's buffers ("bn1.running_mean") */
  KILN_TENSORS_MODEL = 3,      /* both, as a checkpoint's model.safetensors names them */
  KILN_TENSORS_OPTIMIZER = 4,  /* the optimizer's state, "<parameter>.<slot>"
                                  ("fc1.weight.exp_avg"); empty before the first step for
                                  optimizers that create their state then */
  KILN_TENSORS_AVERAGE = 8     /* [ema]'s moving average of the parameters and buffers,
                                  "ema/<name>" as a checkpoint's trainer.safetensors names it
                                  (floating ones at least float32). Added after version 2's
                                  first release: a library without it refuses the bit with
                                  KILN_ERR_INVALID_ARGUMENT; a pipeline without [ema] with
                                  KILN_ERR_FAILED_PRECONDITION */
};

/* session_load_tensors' flags (bits, uint32_t); 0 is strict. */
enum {
  KILN_LOAD_ALLOW_MISSING = 1,   /* model tensors not given keep their values */
  KILN_LOAD_ALLOW_UNEXPECTED = 2 /* given names the model does not have are skipped */
};

/* The function table (version 1, then version 2's appended slots). Every slot of the served
 * version is non-NULL. */
typedef struct kiln_api {
  size_t struct_size; /* sizeof(kiln_api) as the library knows it: slots past it are absent */
  uint32_t version;   /* the API version this table serves (as asked of kiln_get_api) */
  uint32_t reserved;  /* zero */

  /* ---- versions (any thread) ---- */

  /* "kiln 0.1.0, C API 1, plugin ABI 1.2, LibTorch 2.11.0". Library-owned, static. */
  const char* (*version_string)(void);
  /* The plugin ABI the library loads (KILN_ABI_MAJOR/MINOR it was built with). Caller-owned
   * outs. */
  void (*plugin_abi)(uint32_t* major, uint32_t* minor);

  /* ---- statuses (any thread) ---- */

  /* The status's code (KILN_ERR_*); KILN_OK for NULL. */
  int32_t (*status_code)(const kiln_status* status);
  /* Its message. Owned by the status, valid until status_release; "" for NULL. */
  const char* (*status_message)(const kiln_status* status);
  /* Frees a status returned by any function of this table. NULL is a no-op. */
  void (*status_release)(kiln_status* status);

  /* ---- sessions (serialized; see THREADS) ---- */

  /* Reads the pipeline file `path` (borrowed), applies options->overrides, loads the plugins
   * (built-in, KILN_PLUGIN_PATH, options->plugin_paths, the pipeline's [plugins] paths),
   * validates everything, then builds data, model, optimizer and schedule (and joins the
   * process group when options->distributed). `options` is borrowed and may be NULL for all
   * defaults. On success *out is a new session the caller owns (session_destroy); on failure
   * *out is NULL and the status says why (KILN_ERR_CONFIG, KILN_ERR_PLUGIN_REFUSED, ...). */
  KILN_MUST_USE_SLOT kiln_status* (*session_create_from_file)(const char* path,
                                                              const kiln_session_options* options,
                                                              kiln_session** out);
  /* The same from TOML text (borrowed). `name` (borrowed) stands for the file in messages and
   * in the default output folder runs/<name>; relative data paths are taken from the current
   * directory. */
  KILN_MUST_USE_SLOT kiln_status* (*session_create_from_string)(const char* toml, const char* name,
                                                                const kiln_session_options* options,
                                                                kiln_session** out);
  /* Frees the session and everything it holds. Writes nothing (call session_save_checkpoint
   * first to keep the state). NULL is a no-op; so is a call from inside the metrics callback
   * (destroy after the call that ran it returns). */
  void (*session_destroy)(kiln_session* session);

  /* Sets (or with callback NULL, clears) the metrics callback. `user_data` is passed back
   * as is; the caller keeps it alive while the callback is set. */
  KILN_MUST_USE_SLOT kiln_status* (*session_set_metrics_callback)(kiln_session* session,
                                                                  kiln_metrics_callback callback,
                                                                  void* user_data);

  /* Trains until the state leaves KILN_SESSION_READY, as `kiln run` does: evaluation at each
   * epoch's end when run.eval, checkpoints as run.checkpoint_every says and at the end. NULL
   * when training ended (finished, cancelled, or stopped by a guard: read session_progress). */
  KILN_MUST_USE_SLOT kiln_status* (*session_run)(kiln_session* session);
  /* One optimizer step (accumulation_steps micro-batches), with its metrics record and any
   * checkpoint run.checkpoint_every asks for. It does not evaluate: at an epoch's end
   * (kiln_progress.epoch_ended) call session_evaluate if you want the test figures. When the
   * step completes the run, the final checkpoint is written. KILN_ERR_FAILED_PRECONDITION when
   * the state is not READY. */
  KILN_MUST_USE_SLOT kiln_status* (*session_step)(kiln_session* session);
  /* Evaluates the model on the test split now, writes the record to the metrics file and the
   * callback, and fills *out (caller-owned; may be NULL). In a data-parallel run every rank
   * must call it. */
  KILN_MUST_USE_SLOT kiln_status* (*session_evaluate)(kiln_session* session, kiln_metrics* out);
  /* Writes a checkpoint of the current state (rank 0 writes; the others return ""), even when
   * run.checkpoints is off. *path (may be NULL) is set to the folder: library-owned, valid
   * until session_destroy. */
  KILN_MUST_USE_SLOT kiln_status* (*session_save_checkpoint)(kiln_session* session,
                                                             const char** path);

  /* Asks the session to stop after the step it is in (or before the next one): it writes the
   * step's checkpoint (when run.checkpoints) and moves to KILN_SESSION_CANCELLED. In a
   * data-parallel run every rank stops after the same step. Any thread; never blocks. */
  void (*session_cancel)(kiln_session* session);

  /* Fills *out (caller-owned). Any thread, without waiting for a step in progress. */
  KILN_MUST_USE_SLOT kiln_status* (*session_progress)(const kiln_session* session,
                                                      kiln_progress* out);
  /* The latest record of `kind` (KILN_METRICS_*) into *out (caller-owned); out->kind is 0 when
   * there is none yet. Any thread, without waiting for a step in progress. */
  KILN_MUST_USE_SLOT kiln_status* (*session_last_metrics)(const kiln_session* session, int32_t kind,
                                                          kiln_metrics* out);

  /* ---- plugins (any thread) ---- */

  /* Loads the plugin libraries in the built-in folder, KILN_PLUGIN_PATH and `extra_dirs`
   * (borrowed; may be NULL when count is 0). *out is a new list the caller owns
   * (plugins_release). Libraries refused are listed by plugins_refused, not reported as an
   * error. */
  KILN_MUST_USE_SLOT kiln_status* (*plugins_list)(const char* const* extra_dirs,
                                                  size_t extra_dir_count, kiln_plugin_list** out);
  /* Components in the list. */
  size_t (*plugins_count)(const kiln_plugin_list* list);
  /* Component `index` (< plugins_count) into *out (caller-owned). */
  KILN_MUST_USE_SLOT kiln_status* (*plugins_get)(const kiln_plugin_list* list, size_t index,
                                                 kiln_plugin_info* out);
  /* Refused libraries in the list. */
  size_t (*plugins_refused_count)(const kiln_plugin_list* list);
  /* Refusal `index`: "<path>: <reason>". Owned by the list, valid until plugins_release; NULL
   * when index is out of range. */
  const char* (*plugins_refused)(const kiln_plugin_list* list, size_t index);
  /* Frees the list. NULL is a no-op. */
  void (*plugins_release)(kiln_plugin_list* list);

  /* ==== version 2 (present when struct_size >= KILN_API_V2_SIZE) ==== */

  /* ---- statuses (any thread) ---- */

  /* Where a KILN_ERR_CONFIG status points: fills *out (caller-owned) and returns 1. Returns 0
   * with "" and 0 in *out when the status carries no location (another code, or an error known
   * only by its message) or is NULL. `out` NULL or its struct_size below
   * KILN_STATUS_LOCATION_V1_SIZE: returns 0 and writes nothing. The message text names the same
   * place. */
  int32_t (*status_location)(const kiln_status* status, kiln_status_location* out);

  /* ---- tensors (serialized, except the tensor_list_* functions; see THREADS) ---- */

  /* The session's live tensors of `kinds` (KILN_TENSORS_* bits): parameters, then buffers,
   * then optimizer state, then the average, each in the model's order. No data is copied:
   * the list holds references to the tensors the next step trains (and updates the average
   * of). *out is a new list the caller owns (tensor_list_release). KILN_ERR_INVALID_ARGUMENT
   * for kinds 0 or unknown bits; KILN_ERR_FAILED_PRECONDITION inside the metrics callback, on
   * a failed session, and for KILN_TENSORS_AVERAGE without [ema]. */
  KILN_MUST_USE_SLOT kiln_status* (*session_tensors)(kiln_session* session, uint32_t kinds,
                                                     kiln_tensor_list** out);
  /* Tensors in the list. */
  size_t (*tensor_list_count)(const kiln_tensor_list* list);
  /* The name of tensor `index`. Owned by the list, valid until tensor_list_release; NULL when
   * index is out of range. */
  const char* (*tensor_list_name)(const kiln_tensor_list* list, size_t index);
  /* A DLPack view of tensor `index` (< tensor_list_count) into *out: a new managed tensor the
   * caller owns, released by calling (*out)->deleter(*out) once, or by a DLPack consumer it is
   * handed to (torch.from_dlpack of a "dltensor" capsule). It ALIASES the training tensor, no
   * copy: it sees every later step, and writing through it changes the training (the
   * parameter a step updates, the state it reads). It holds its own reference to the storage,
   * so it stays valid after tensor_list_release and session_destroy. CPU tensors are kDLCPU,
   * CUDA ones kDLCUDA. */
  KILN_MUST_USE_SLOT kiln_status* (*tensor_list_get)(const kiln_tensor_list* list, size_t index,
                                                     struct DLManagedTensor** out);
  /* Frees the list (the views handed out stay valid). NULL is a no-op. */
  void (*tensor_list_release)(kiln_tensor_list* list);

  /* Copies `count` tensors into the model's parameters and buffers of the same names (as
   * session_tensors names them); the optimizer's state is left as it is. names[i] and
   * tensors[i] are borrowed: only tensors[i]->dl_tensor is read (any device and strides), and
   * the library never calls their deleters. With fp32 master weights (a half-precision model)
   * the masters are loaded too. With [ema], "ema/<name>" tensors (KILN_TENSORS_AVERAGE's
   * names) load the average; they are optional. Everything is checked before anything is
   * copied: a name the model does not have (unless KILN_LOAD_ALLOW_UNEXPECTED), a model tensor
   * not given (unless KILN_LOAD_ALLOW_MISSING), a name given twice, another shape, or a dtype
   * of another kind (floating-point dtypes are cast to the model's, as torch's load_state_dict
   * does; integer and bool ones must match) return KILN_ERR_INVALID_ARGUMENT naming the key
   * and change nothing. KILN_ERR_FAILED_PRECONDITION inside the metrics callback and on a failed
   * session. In a data-parallel run every rank must load the same tensors. */
  KILN_MUST_USE_SLOT kiln_status* (*session_load_tensors)(
      kiln_session* session, const char* const* names, const struct DLManagedTensor* const* tensors,
      size_t count, uint32_t flags);
} kiln_api;
#define KILN_API_V1_SIZE KILN_SIZE_UP_TO(kiln_api, plugins_release)
#define KILN_API_V2_SIZE KILN_SIZE_UP_TO(kiln_api, session_load_tensors)

/* The function table of API `version` (1 .. KILN_CAPI_VERSION of the library), or NULL when the
 * library does not serve it. Its struct_size is that version's size (KILN_API_V1_SIZE for 1)
 * and its version the one asked. Library-owned, static: valid while libkiln is loaded. Any
 * thread. */
#if defined(_WIN32)
__declspec(dllimport)
#else
__attribute__((visibility("default")))
#endif
    const kiln_api* kiln_get_api(uint32_t version);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_KILN_H_ */
