// SIGINT and SIGTERM during a run: the first asks the trainer to finish the current step, write
// a checkpoint and exit (128 + signal); a second one exits at once.
//
// Owned by whoever owns the process's signals (`kiln run`: the CLI; a C API session only when
// its options ask) and handed to the trainer through RunOptions. A handler can reach nothing but
// static storage, so what it records is one static std::sig_atomic_t, owned by the one
// StopSignals installed at a time (a second is refused while the first lives).
#pragma once

#include <csignal>

namespace kiln::engine {

class StopSignals {
 public:
  // Installs the handlers, clearing what an earlier installation recorded. Throws
  // std::logic_error while another StopSignals is installed.
  StopSignals();
  ~StopSignals();  // restores the handlers that were there before
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal received since installation (SIGINT or SIGTERM), or 0.
  int received() const;

 private:
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
};

}  // namespace kiln::engine
