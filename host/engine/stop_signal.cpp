#include "engine/stop_signal.hpp"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace kiln::engine {
namespace {

std::atomic<int> g_received{0};
struct sigaction g_previous_int, g_previous_term;

void on_signal(int signal) {
  // A second signal means "now": only async-signal-safe calls here.
  if (g_received.exchange(signal) != 0) _exit(128 + signal);
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &g_previous_int);
  sigaction(SIGTERM, &action, &g_previous_term);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
}

int StopSignals::received() { return g_received.load(); }

}  // namespace kiln::engine
