// The `kiln` subcommands. Each returns the process exit code:
// 0 success, 1 run-time failure, 2 configuration error, 3 plugin refused.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::io {
class StatusLine;
}

namespace kiln::cli {

struct PipelineArgs {
  std::string file;
  std::vector<std::string> overrides;  // --set KEY=VALUE
};

// Exit code 4 when a guard stopped training, 128 + signal after SIGINT/SIGTERM.
// `kiln export CHECKPOINT --to FILE [--dtype fp32|fp16|bf16|keep] [--ema]`: the checkpoint's
// model weights (verified first), or with `ema` their moving average, as one safetensors file,
// floating tensors cast to `dtype`. `from` may also be a run folder or an output folder: its
// newest checkpoint (io/run_folder).
int export_weights(const std::string& from, const std::string& to, const std::string& dtype,
                   bool ema = false);

// `kiln plot METRICS -o PNG`: loss, accuracy, lr and loss-scale curves.
int plot(const std::string& metrics, const std::string& png);

// `terminal`: the status line the progress bar is drawn on (the CLI's, erased by its logger).
// The run owns the process: it installs the SIGINT/SIGTERM handlers for its length and makes
// every process-wide setting (engine::ProcessSettings).
int run(const PipelineArgs& args, const std::string& metrics_path, const std::string& resume,
        io::StatusLine& terminal);
// `kiln evaluate FILE (--checkpoint DIR|auto | --weights FILE)`: the pipeline's model with those
// weights on its evaluation split, once, as a run's evaluation (top-1, top-5, loss), printed and
// written to `metrics_path` when given. `checkpoint` is resolved as export's (a checkpoint, run
// or output folder) or "auto" (the newest of the pipeline's output folder); `weights` sets
// model.init. Writes nothing else: no run folder, no checkpoint.
int evaluate(const PipelineArgs& args, const std::string& checkpoint, const std::string& weights,
             const std::string& metrics_path);
// Creates every component as a run over `world_size` ranks would, and reports what it refuses.
int validate(const PipelineArgs& args, int64_t world_size);
int plan(const PipelineArgs& args);
// `kiln loader-bench FILE --batches N --warmup W`: builds the pipeline's training loader (rank 0
// of one process, on the CPU), takes W + N batches and prints one JSON line: images/s over the N,
// seconds from the loader's creation to its first batch, seconds to open the dataset.
int loader_bench(const PipelineArgs& args, int64_t batches, int64_t warmup);
// Prints every group's lr at every iteration (table or CSV) and optionally writes a PNG plot;
// `metrics` (a run's metrics file) replays its evaluations into a policy that reacts to them.
int lr_schedule(const PipelineArgs& args, int64_t iters, bool csv, const std::string& png,
                const std::string& metrics);
// Prints docs/config.md: every core key and every built-in plugin option (from the schemas).
int config_docs();
int plugins_list(const std::vector<std::string>& extra_dirs);
int plugins_describe(const std::string& name, const std::vector<std::string>& extra_dirs);

}  // namespace kiln::cli
