// kiln_get_api: the one exported symbol of libkiln, and the version-1 function table.
#include <torch/version.h>

#include "capi/guard.hpp"
#include "capi/plugins.hpp"
#include "capi/session.hpp"
#include "plugin/status.hpp"

namespace kiln::capi {
namespace {

#define KILN_STR2(x) #x
#define KILN_STR(x) KILN_STR2(x)

const char* version_string() {
  return "kiln " KILN_VERSION ", C API " KILN_STR(KILN_CAPI_VERSION) ", plugin ABI " KILN_STR(
      KILN_ABI_MAJOR) "." KILN_STR(KILN_ABI_MINOR) ", LibTorch " TORCH_VERSION;
}

void plugin_abi(uint32_t* major, uint32_t* minor) {
  if (major != nullptr) *major = KILN_ABI_MAJOR;
  if (minor != nullptr) *minor = KILN_ABI_MINOR;
}

const kiln_api kApiV1 = {
    sizeof(kiln_api),
    1,
    0,
    version_string,
    plugin_abi,
    plugin::status_code,
    plugin::status_message,
    plugin::free_status,
    session_create_from_file,
    session_create_from_string,
    session_destroy,
    session_set_metrics_callback,
    session_run,
    session_step,
    session_evaluate,
    session_save_checkpoint,
    session_cancel,
    session_progress,
    session_last_metrics,
    plugins_list,
    plugins_count,
    plugins_get,
    plugins_refused_count,
    plugins_refused,
    plugins_release,
};

}  // namespace
}  // namespace kiln::capi

extern "C" const kiln_api* kiln_get_api(uint32_t version) {
  return version == 1 ? &kiln::capi::kApiV1 : nullptr;
}
