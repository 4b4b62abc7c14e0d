// TOML++'s implementation, compiled once for the fuzz target (every other file includes the
// headers with TOML_HEADER_ONLY=0), so the parser is built with the sanitizers and coverage.
#define TOML_IMPLEMENTATION
#include <toml++/toml.h>
