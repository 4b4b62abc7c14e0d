// The training run of a resolved pipeline: one process, or one rank of a data-parallel run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/pipeline.hpp"
#include "dist/launch_env.hpp"

namespace kiln::engine {

struct RunOptions {
  std::string metrics_path;  // JSON-lines metrics; empty: none
  std::string resume;        // "auto" (newest usable checkpoint), a checkpoint folder, or ""
  // This process's place in a distributed run (from the launcher's environment); nullopt: a
  // single-process run. With it, the run joins a c10d process group and trains data-parallel.
  std::optional<dist::LaunchEnv> launch;
};

struct RunResult {
  double test_accuracy = 0.0;  // last evaluation, fraction in [0, 1]; NaN when none ran
  double test_loss = 0.0;
  int64_t steps = 0;            // optimizer steps attempted (applied + skipped)
  int64_t skipped_steps = 0;    // steps skipped for non-finite gradients
  std::string stopped;          // why a guard stopped the run early; empty when it ran to the end
  std::string saved_weights;    // the weights file written when a guard stopped the run
  int signal = 0;               // SIGINT/SIGTERM that ended the run early (checkpoint written)
  std::string last_checkpoint;  // the newest checkpoint this run wrote
  double train_seconds = 0.0;   // wall time of the training loop (evaluation included)
};

// Builds every component from `pipeline` and trains. Throws on configuration problems found at
// build time (capabilities, missing data) and on component errors.
RunResult train(const config::Pipeline& pipeline, const RunOptions& options);

}  // namespace kiln::engine
