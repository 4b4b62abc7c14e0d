/* Exports a function, but neither kiln_plugin_abi nor kiln_plugin_get. */
#include "kiln/abi.h"

KILN_EXPORT int not_a_kiln_plugin(void) { return 42; }
