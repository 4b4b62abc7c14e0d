#include "engine/stop_signal.hpp"

#include <unistd.h>

#include <csignal>
#include <stdexcept>

namespace kiln::engine {
namespace {

// The signal the installed StopSignals received, or 0. The one piece of static state: a signal
// handler has no other way to reach its owner. Written only by the handler and by the
// installation that owns it.
volatile std::sig_atomic_t g_received = 0;

void on_signal(int signal) {
  // A second signal means "now": only async-signal-safe calls here. Both signals are blocked
  // while the handler runs (sa_mask), so the read and the write below do not race another.
  if (g_received != 0) _exit(128 + signal);
  g_received = signal;
}

}  // namespace

StopSignals::StopSignals() {
  struct sigaction current {};
  sigaction(SIGINT, nullptr, &current);
  if (current.sa_handler == on_signal) {
    throw std::logic_error("stop signals: another StopSignals is installed in this process");
  }
  g_received = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaddset(&action.sa_mask, SIGINT);
  sigaddset(&action.sa_mask, SIGTERM);
  sigaction(SIGINT, &action, &previous_int_);
  sigaction(SIGTERM, &action, &previous_term_);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &previous_int_, nullptr);
  sigaction(SIGTERM, &previous_term_, nullptr);
}

int StopSignals::received() const { return g_received; }

}  // namespace kiln::engine
