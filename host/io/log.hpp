// Console logging set-up (spdlog): one pattern for the host's and the plugins' log calls, and
// log lines that never print over the terminal's status line (the progress bar).
#pragma once

#include <spdlog/sinks/sink.h>

#include <memory>

namespace kiln::io {

class StatusLine;

// Where console log lines go: the CLI's on stdout, an embedding program's (C API) on stderr
// so that its stdout stays its own.
enum class ConsoleStream { kStdout, kStderr };

// Makes the default logger a colour console logger on `stream` with Kiln's pattern, whose
// lines first erase `line` (nullptr: no status line to erase). `line` must outlive the logger:
// its owner installs another logger before it goes. The level is left to the caller.
void install_console_logger(ConsoleStream stream, StatusLine* line);

// The CLI's logging for as long as it lives: install_console_logger(kStdout, &line), `verbose`
// enabling debug lines; on destruction a logger without the line, which goes with it.
class CliLogging {
 public:
  CliLogging(bool verbose, StatusLine& line);
  ~CliLogging();
  CliLogging(const CliLogging&) = delete;
  CliLogging& operator=(const CliLogging&) = delete;
};

// A sink that hands each line to `inner` after erasing `line`, with no redraw in between,
// whichever thread logs. `line` must outlive the sink.
std::shared_ptr<spdlog::sinks::sink> below_status_line(std::shared_ptr<spdlog::sinks::sink> inner,
                                                       StatusLine& line);

}  // namespace kiln::io
