// The terminal's status line: one line redrawn in place (the progress bar), which every log
// line erases first, from any thread, so that no log line is printed over it. Owned by the
// program that owns the terminal (`kiln run`: the CLI), which hands it to its console logger
// (io/log) and to the trainer (RunOptions::status_line).
#pragma once

#include <cstdio>
#include <mutex>
#include <string>

namespace kiln::io {

class StatusLine {
 public:
  // Draws on `out`, which the caller keeps open for the line's lifetime.
  explicit StatusLine(std::FILE* out) : out_(out) {}

  // Redraws the line in place: carriage return, `text`, clear to end of line ("\033[K" erases
  // what a longer line before left). Flushes. `text` must fit the terminal's width.
  void draw(const std::string& text);

  // Erases the line, when one is shown, so that the next output starts on a clean line.
  void clear();

  // Whether a line is on the terminal now (false once anything cleared it).
  bool shown() const;

  // Runs `write` (one log line, say) with the line erased first and no draw in between, so the
  // two never interleave. `write` must not use this StatusLine.
  template <typename Write>
  void write_below(Write&& write) {
    std::lock_guard<std::mutex> guard(lock_);
    erase_locked();
    write();
  }

 private:
  void erase_locked();

  mutable std::mutex lock_;  // one writer at a time: the drawing thread and logging threads
  std::FILE* out_;
  bool shown_ = false;
};

// Whether stderr is a terminal (isatty), i.e. whether an in-place line makes sense.
bool stderr_is_terminal();

// Columns of the terminal on stderr (TIOCGWINSZ); 100 when it has none.
int terminal_width();

}  // namespace kiln::io
