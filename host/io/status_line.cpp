#include "io/status_line.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

namespace kiln::io {

void StatusLine::draw(const std::string& text) {
  std::lock_guard<std::mutex> guard(lock_);
  std::fprintf(out_, "\r%s\033[K", text.c_str());
  std::fflush(out_);
  shown_ = true;
}

void StatusLine::clear() {
  std::lock_guard<std::mutex> guard(lock_);
  erase_locked();
}

bool StatusLine::shown() const {
  std::lock_guard<std::mutex> guard(lock_);
  return shown_;
}

void StatusLine::erase_locked() {
  if (!shown_) return;
  std::fputs("\r\033[K", out_);
  std::fflush(out_);
  shown_ = false;
}

bool stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

int terminal_width() {
  winsize ws{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 100;
}

}  // namespace kiln::io
