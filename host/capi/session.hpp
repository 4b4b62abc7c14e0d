// The C functions behind kiln_api's session_* slots: a kiln_session holds its plugins, the
// resolved pipeline and an engine::Trainer, plus a snapshot other threads may read.
#pragma once

#include <functional>

#include "kiln/kiln.h"

namespace kiln::engine {
class Trainer;
}

namespace kiln::capi {

kiln_status* session_create_from_file(const char* path, const kiln_session_options* options,
                                      kiln_session** out);
kiln_status* session_create_from_string(const char* toml, const char* name,
                                        const kiln_session_options* options, kiln_session** out);
void session_destroy(kiln_session* session);
kiln_status* session_set_metrics_callback(kiln_session* session, kiln_metrics_callback callback,
                                          void* user_data);
kiln_status* session_run(kiln_session* session);
kiln_status* session_step(kiln_session* session);
kiln_status* session_evaluate(kiln_session* session, kiln_metrics* out);
kiln_status* session_save_checkpoint(kiln_session* session, const char** path);
void session_cancel(kiln_session* session);
kiln_status* session_progress(const kiln_session* session, kiln_progress* out);
kiln_status* session_last_metrics(const kiln_session* session, int32_t kind, kiln_metrics* out);

// Runs `f` on the session's trainer under the training lock, after the checks every serialized
// call makes (NULL session, inside a callback, failed). An exception becomes a status (`call`
// names it) and leaves the session usable: for calls that only read or replace tensors.
kiln_status* with_trainer(kiln_session* session, const char* call,
                          const std::function<kiln_status*(engine::Trainer&)>& f);

}  // namespace kiln::capi
