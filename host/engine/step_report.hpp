// What one optimizer step produced, as the sinks receive it (engine/sinks), and the pieces the
// step assembles it from: where memory and all-reduces stood when it began (StepMeter) and what
// the ranks agree on after it (RankVote).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

#include "engine/optimizer_step.hpp"
#include "engine/run_position.hpp"
#include "engine/window_pass.hpp"
#include "io/metrics.hpp"

namespace kiln::dist {
class DataParallel;
class ProcessGroup;
}  // namespace kiln::dist

namespace kiln::engine {

struct StepReport {
  io::StepRecord record;  // what the metrics file gets
  StepOutcome outcome;    // the verdict, the gradient check (non-finite names), the group lrs
  RunPosition position;   // where the run is after the step (what a checkpoint of it saves)
  double loss_sum = 0.0;  // loss x samples over every rank (progress averages these)
  double samples = 0.0;   // over every rank
  bool logged = false;    // the step gets a progress line (run.log_interval, the last step)
  bool last_of_epoch = false;
  bool last_of_run = false;
};

// What every rank learns after a step: the loss over all ranks, and a stop any rank was asked
// for (SIGTERM wins over SIGINT), so that all ranks stop after the same step.
struct RankVote {
  double loss_sum = 0.0;
  double samples = 0.0;
  int signal = 0;
  bool cancel = false;
};
// One small all-reduce; `group` null (one process): `mine` as it is.
RankVote agree(dist::ProcessGroup* group, const RankVote& mine);

// Memory and all-reduce counts at a step's start; fills a record's fields at its end.
class StepMeter {
 public:
  // Resets the peak of tensor memory on `device`. `ddp` may be null.
  StepMeter(c10::Device device, const dist::DataParallel* ddp);
  // `read_process_peak`: the CPU's process peak is a system call (getrusage), read on logged
  // steps only (docs/speed.md); CUDA's is the caching allocator's count, read every step.
  void fill(io::StepRecord& record, bool read_process_peak) const;

 private:
  c10::Device device_;
  const dist::DataParallel* ddp_;
  int64_t resting_bytes_ = 0;
  int64_t allreduces_before_ = 0;
};

}  // namespace kiln::engine
