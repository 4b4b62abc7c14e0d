// The process-wide torch settings a pipeline's [run] table chooses: intra-op threads, TF32,
// cuDNN's algorithm search.
#pragma once
#include "config/options.hpp"

namespace kiln::engine {

// Applies run.threads (when > 0), run.tf32 (unless "default") and run.cudnn_benchmark to
// torch's global context. The flags exist without CUDA too; they only act on CUDA work.
void apply_torch_settings(const config::OptionSet& run);

}  // namespace kiln::engine
