/* The C API's version-2 additions (kiln/kiln.h) on x86-64 Linux, pinned as capi_v1_layout.c
 * pins version 1: the slots appended to kiln_api, kiln_status_location, and the constants.
 * Appending is allowed; these numbers never change within KILN_CAPI_VERSION 2. */
#include <kiln/kiln.h>
#include <stddef.h>

_Static_assert(KILN_CAPI_VERSION >= 2, "C API version");
_Static_assert(KILN_TENSORS_PARAMETERS == 1 && KILN_TENSORS_BUFFERS == 2 &&
                   KILN_TENSORS_MODEL == 3 && KILN_TENSORS_OPTIMIZER == 4,
               "tensor kinds");
_Static_assert(KILN_TENSORS_AVERAGE == 8, "the average's bit");
_Static_assert(KILN_WEIGHTS_TRAINED == 1 && KILN_WEIGHTS_AVERAGE == 2, "kiln_metrics.weights");
_Static_assert(KILN_LOAD_ALLOW_MISSING == 1 && KILN_LOAD_ALLOW_UNEXPECTED == 2, "load flags");
_Static_assert(sizeof(kiln_status_location) == 40, "sizeof kiln_status_location");
_Static_assert(KILN_STATUS_LOCATION_V1_SIZE == 40, "kiln_status_location first size");
_Static_assert(offsetof(kiln_status_location, file) == 8, "kiln_status_location.file");
_Static_assert(offsetof(kiln_status_location, line) == 16, "kiln_status_location.line");
_Static_assert(offsetof(kiln_status_location, column) == 24, "kiln_status_location.column");
_Static_assert(offsetof(kiln_status_location, key) == 32, "kiln_status_location.key");
_Static_assert(KILN_API_V1_SIZE == 192, "version 1 ends where it did");
_Static_assert(offsetof(kiln_api, status_location) == 192, "kiln_api.status_location");
_Static_assert(offsetof(kiln_api, session_tensors) == 200, "kiln_api.session_tensors");
_Static_assert(offsetof(kiln_api, tensor_list_count) == 208, "kiln_api.tensor_list_count");
_Static_assert(offsetof(kiln_api, tensor_list_name) == 216, "kiln_api.tensor_list_name");
_Static_assert(offsetof(kiln_api, tensor_list_get) == 224, "kiln_api.tensor_list_get");
_Static_assert(offsetof(kiln_api, tensor_list_release) == 232, "kiln_api.tensor_list_release");
_Static_assert(offsetof(kiln_api, session_load_tensors) == 240, "kiln_api.session_load_tensors");
_Static_assert(KILN_API_V2_SIZE == 248, "version 2 size");
_Static_assert(sizeof(kiln_api) == 248, "sizeof kiln_api");

int main(void) { return 0; }
