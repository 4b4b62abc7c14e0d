// SIGINT and SIGTERM during a run: the first asks the trainer to finish the current step, write
// a checkpoint and exit (128 + signal); a second one exits at once.
#pragma once

namespace kiln::engine {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal received (SIGINT or SIGTERM), or 0.
  static int received();
};

}  // namespace kiln::engine
