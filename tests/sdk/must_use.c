/* Ignoring a kiln_status* marked KILN_MUST_USE_SLOT (a services slot, a vtable slot, a C API
 * slot) or KILN_MUST_USE (kiln::guard, C++ only) draws the compiler's unused-result warning.
 * IGNORE selects the dropped call (0: none, every status handled). Compiled as C and as C++. */
#include "kiln/kiln.h"
#include "kiln/optimizer.h"
#include "kiln/plugin.h"
#ifdef __cplusplus
#include "kiln/sdk.hpp"
#endif

#ifndef IGNORE
#define IGNORE 0
#endif

int handled(const kiln_host_api* host, const kiln_optimizer_vtable* vtable, const kiln_api* api,
            kiln_session* session, kiln_call_context* ctx, const kiln_param_group* group) {
  kiln_status* status = NULL;
#if IGNORE == 1
  host->make_status(KILN_ERR_INTERNAL, "dropped");
#elif IGNORE == 2
  vtable->step(NULL, ctx, group);
#elif IGNORE == 3
  api->session_step(session);
#elif IGNORE == 4 && defined(__cplusplus)
  kiln::guard(host, [] {});
#else
  status = host->make_status(KILN_ERR_INTERNAL, "kept");
  if (status == NULL) status = vtable->step(NULL, ctx, group);
  if (status == NULL) status = api->session_step(session);
#ifdef __cplusplus
  if (status == NULL) status = kiln::guard(host, [] {});
#endif
#endif
  return status != NULL;
}
