// Console logging set-up (spdlog): one pattern for the host and the plugins' log calls.
#pragma once

namespace kiln::io {

// Sets the log pattern; `verbose` enables debug lines.
void setup_logging(bool verbose);

}  // namespace kiln::io
