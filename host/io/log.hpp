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
// lines first erase terminal_status_line(). Its level is left to the caller.
void install_console_logger(ConsoleStream stream);

// The CLI's logging: install_console_logger(kStdout); `verbose` enables debug lines.
void setup_logging(bool verbose);

// A sink that hands each line to `inner` after erasing `line`, with no redraw in between,
// whichever thread logs. `line` must outlive the sink.
std::shared_ptr<spdlog::sinks::sink> below_status_line(std::shared_ptr<spdlog::sinks::sink> inner,
                                                       StatusLine& line);

}  // namespace kiln::io
