// The process-wide torch settings a pipeline's [run] table chooses: intra-op threads, TF32,
// cuDNN's algorithm search. A run applies them only when it may change the process
// (engine::ProcessSettings::torch_settings: `kiln run`, or a C API session that asks).
#pragma once
#include "config/settings.hpp"

namespace kiln::engine {

// Applies run.threads (when > 0), run.tf32 (unless "default") and run.cudnn_benchmark to
// torch's global context. The flags exist without CUDA too; they only act on CUDA work.
void apply_torch_settings(const config::RunSettings& run);

// For a run that may not change the process: logs the run.threads and run.tf32 it leaves
// unapplied, when the pipeline sets them, so that a missing setting is never a surprise.
void report_torch_settings_left(const config::RunSettings& run);

}  // namespace kiln::engine
