// kiln_get_api: the one exported symbol of libkiln, and its function tables: version 2's, and
// version 1's, the same slots served with version 1's size.
#include <torch/version.h>

#include "capi/guard.hpp"
#include "capi/plugins.hpp"
#include "capi/session.hpp"
#include "capi/tensors.hpp"
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

const kiln_api kApiV2 = {
    KILN_API_V2_SIZE,
    2,
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
    status_location,
    session_tensors,
    tensor_list_count,
    tensor_list_name,
    tensor_list_get,
    tensor_list_release,
    session_load_tensors,
};

// A version-1 caller's table: its struct_size says the version-2 slots are absent.
kiln_api v1_table() {
  kiln_api t = kApiV2;
  t.struct_size = KILN_API_V1_SIZE;
  t.version = 1;
  return t;
}
const kiln_api kApiV1 = v1_table();

}  // namespace
}  // namespace kiln::capi

extern "C" const kiln_api* kiln_get_api(uint32_t version) {
  switch (version) {
    case 1:
      return &kiln::capi::kApiV1;
    case 2:
      return &kiln::capi::kApiV2;
    default:
      return nullptr;
  }
}
