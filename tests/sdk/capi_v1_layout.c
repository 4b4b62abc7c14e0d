/* The C API's version-1 layout (kiln/kiln.h) on x86-64 Linux, pinned: a change that moves,
 * resizes or retypes any of it fails the build of this file (the sdk_capi_v1_layout test).
 * Appending is allowed; these numbers never change within KILN_CAPI_VERSION 1. Generated once
 * from the header, then frozen by hand. */
#include <kiln/kiln.h>
#include <stddef.h>

_Static_assert(KILN_CAPI_VERSION >= 1, "C API version");
_Static_assert(KILN_ERR_CONFIG == 16 && KILN_ERR_PLUGIN_REFUSED == 17 && KILN_ERR_RUN_FAILED == 18,
               "status codes");
_Static_assert(KILN_SESSION_READY == 0 && KILN_SESSION_FINISHED == 1 &&
                   KILN_SESSION_CANCELLED == 2 && KILN_SESSION_STOPPED == 3 &&
                   KILN_SESSION_FAILED == 4,
               "session states");
_Static_assert(KILN_METRICS_STEP == 1 && KILN_METRICS_EVAL == 2, "metrics kinds");
_Static_assert(KILN_SESSION_LOG_DEFAULT == 0 && KILN_SESSION_LOG_OFF == 5, "log levels");
_Static_assert(sizeof(kiln_session_options) == 96, "sizeof kiln_session_options");
_Static_assert(KILN_SESSION_OPTIONS_V1_SIZE == 64, "KILN_SESSION_OPTIONS_V1_SIZE");
_Static_assert(offsetof(kiln_session_options, process_settings) == 64,
               "kiln_session_options.process_settings"); /* appended */
_Static_assert(offsetof(kiln_session_options, components) == 72 &&
                   offsetof(kiln_session_options, component_count) == 80 &&
                   offsetof(kiln_session_options, component_origin) == 88 &&
                   KILN_SESSION_OPTIONS_V2_SIZE == 96,
               "kiln_session_options V2 (in-process components, appended)");
_Static_assert(offsetof(kiln_session_options, overrides) == 8, "kiln_session_options.overrides");
_Static_assert(offsetof(kiln_session_options, override_count) == 16,
               "kiln_session_options.override_count");
_Static_assert(offsetof(kiln_session_options, plugin_paths) == 24,
               "kiln_session_options.plugin_paths");
_Static_assert(offsetof(kiln_session_options, plugin_path_count) == 32,
               "kiln_session_options.plugin_path_count");
_Static_assert(offsetof(kiln_session_options, metrics_path) == 40,
               "kiln_session_options.metrics_path");
_Static_assert(offsetof(kiln_session_options, resume) == 48, "kiln_session_options.resume");
_Static_assert(offsetof(kiln_session_options, log_level) == 56, "kiln_session_options.log_level");
_Static_assert(offsetof(kiln_session_options, distributed) == 60,
               "kiln_session_options.distributed");
_Static_assert(sizeof(kiln_progress) == 88, "sizeof kiln_progress");
_Static_assert(offsetof(kiln_progress, state) == 8, "kiln_progress.state");
_Static_assert(offsetof(kiln_progress, epoch_ended) == 12, "kiln_progress.epoch_ended");
_Static_assert(offsetof(kiln_progress, step) == 16, "kiln_progress.step");
_Static_assert(offsetof(kiln_progress, max_steps) == 24, "kiln_progress.max_steps");
_Static_assert(offsetof(kiln_progress, epoch) == 32, "kiln_progress.epoch");
_Static_assert(offsetof(kiln_progress, epochs) == 40, "kiln_progress.epochs");
_Static_assert(offsetof(kiln_progress, batches_in_epoch) == 48, "kiln_progress.batches_in_epoch");
_Static_assert(offsetof(kiln_progress, batches_per_epoch) == 56, "kiln_progress.batches_per_epoch");
_Static_assert(offsetof(kiln_progress, rank) == 64, "kiln_progress.rank");
_Static_assert(offsetof(kiln_progress, world_size) == 68, "kiln_progress.world_size");
_Static_assert(offsetof(kiln_progress, stop_reason) == 72, "kiln_progress.stop_reason");
_Static_assert(offsetof(kiln_progress, last_checkpoint) == 80, "kiln_progress.last_checkpoint");
_Static_assert(sizeof(kiln_metrics) == 144, "sizeof kiln_metrics (V4: weights)");
_Static_assert(KILN_METRICS_V4_SIZE == 140, "kiln_metrics V4 size");
_Static_assert(offsetof(kiln_metrics, weights) == 136, "kiln_metrics.weights");
_Static_assert(KILN_METRICS_V3_SIZE == 136, "kiln_metrics V3 size");
_Static_assert(KILN_METRICS_V2_SIZE == 128, "kiln_metrics V2 size");
_Static_assert(offsetof(kiln_metrics, map) == 128, "kiln_metrics.map");
_Static_assert(KILN_METRICS_V1_SIZE == 120, "kiln_metrics V1 size");
_Static_assert(offsetof(kiln_metrics, accuracy_top5) == 120, "kiln_metrics.accuracy_top5");
_Static_assert(offsetof(kiln_metrics, kind) == 8, "kiln_metrics.kind");
_Static_assert(offsetof(kiln_metrics, skipped) == 12, "kiln_metrics.skipped");
_Static_assert(offsetof(kiln_metrics, step) == 16, "kiln_metrics.step");
_Static_assert(offsetof(kiln_metrics, epoch) == 24, "kiln_metrics.epoch");
_Static_assert(offsetof(kiln_metrics, loss) == 32, "kiln_metrics.loss");
_Static_assert(offsetof(kiln_metrics, accuracy) == 40, "kiln_metrics.accuracy");
_Static_assert(offsetof(kiln_metrics, lr) == 48, "kiln_metrics.lr");
_Static_assert(offsetof(kiln_metrics, grad_norm) == 56, "kiln_metrics.grad_norm");
_Static_assert(offsetof(kiln_metrics, loss_scale) == 64, "kiln_metrics.loss_scale");
_Static_assert(offsetof(kiln_metrics, step_seconds) == 72, "kiln_metrics.step_seconds");
_Static_assert(offsetof(kiln_metrics, data_seconds) == 80, "kiln_metrics.data_seconds");
_Static_assert(offsetof(kiln_metrics, samples_per_second) == 88, "kiln_metrics.samples_per_second");
_Static_assert(offsetof(kiln_metrics, tensor_mb) == 96, "kiln_metrics.tensor_mb");
_Static_assert(offsetof(kiln_metrics, tensor_peak_mb) == 104, "kiln_metrics.tensor_peak_mb");
_Static_assert(offsetof(kiln_metrics, activation_mb) == 112, "kiln_metrics.activation_mb");
_Static_assert(sizeof(kiln_plugin_info) == 64, "sizeof kiln_plugin_info");
_Static_assert(offsetof(kiln_plugin_info, name) == 8, "kiln_plugin_info.name");
_Static_assert(offsetof(kiln_plugin_info, kind) == 16, "kiln_plugin_info.kind");
_Static_assert(offsetof(kiln_plugin_info, summary) == 24, "kiln_plugin_info.summary");
_Static_assert(offsetof(kiln_plugin_info, library) == 32, "kiln_plugin_info.library");
_Static_assert(offsetof(kiln_plugin_info, version) == 40, "kiln_plugin_info.version");
_Static_assert(offsetof(kiln_plugin_info, abi_major) == 52, "kiln_plugin_info.abi_major");
_Static_assert(offsetof(kiln_plugin_info, abi_minor) == 56, "kiln_plugin_info.abi_minor");
_Static_assert(sizeof(kiln_api) >= 192, "sizeof kiln_api (version 2 appends)");
_Static_assert(offsetof(kiln_api, version) == 8, "kiln_api.version");
_Static_assert(offsetof(kiln_api, version_string) == 16, "kiln_api.version_string");
_Static_assert(offsetof(kiln_api, plugin_abi) == 24, "kiln_api.plugin_abi");
_Static_assert(offsetof(kiln_api, status_code) == 32, "kiln_api.status_code");
_Static_assert(offsetof(kiln_api, status_message) == 40, "kiln_api.status_message");
_Static_assert(offsetof(kiln_api, status_release) == 48, "kiln_api.status_release");
_Static_assert(offsetof(kiln_api, session_create_from_file) == 56,
               "kiln_api.session_create_from_file");
_Static_assert(offsetof(kiln_api, session_create_from_string) == 64,
               "kiln_api.session_create_from_string");
_Static_assert(offsetof(kiln_api, session_destroy) == 72, "kiln_api.session_destroy");
_Static_assert(offsetof(kiln_api, session_set_metrics_callback) == 80,
               "kiln_api.session_set_metrics_callback");
_Static_assert(offsetof(kiln_api, session_run) == 88, "kiln_api.session_run");
_Static_assert(offsetof(kiln_api, session_step) == 96, "kiln_api.session_step");
_Static_assert(offsetof(kiln_api, session_evaluate) == 104, "kiln_api.session_evaluate");
_Static_assert(offsetof(kiln_api, session_save_checkpoint) == 112,
               "kiln_api.session_save_checkpoint");
_Static_assert(offsetof(kiln_api, session_cancel) == 120, "kiln_api.session_cancel");
_Static_assert(offsetof(kiln_api, session_progress) == 128, "kiln_api.session_progress");
_Static_assert(offsetof(kiln_api, session_last_metrics) == 136, "kiln_api.session_last_metrics");
_Static_assert(offsetof(kiln_api, plugins_list) == 144, "kiln_api.plugins_list");
_Static_assert(offsetof(kiln_api, plugins_count) == 152, "kiln_api.plugins_count");
_Static_assert(offsetof(kiln_api, plugins_get) == 160, "kiln_api.plugins_get");
_Static_assert(offsetof(kiln_api, plugins_refused_count) == 168, "kiln_api.plugins_refused_count");
_Static_assert(offsetof(kiln_api, plugins_refused) == 176, "kiln_api.plugins_refused");
_Static_assert(offsetof(kiln_api, plugins_release) == 184, "kiln_api.plugins_release");
_Static_assert(KILN_SESSION_OPTIONS_V1_SIZE == 64, "v1 size");
_Static_assert(KILN_PROGRESS_V1_SIZE == 88, "v1 size");
_Static_assert(KILN_METRICS_V1_SIZE == 120, "v1 size");
_Static_assert(KILN_PLUGIN_INFO_V1_SIZE == 60, "v1 size");
_Static_assert(KILN_API_V1_SIZE == 192, "v1 size");

int main(void) { return 0; }
