// `kiln`: run, launch (several ranks), validate and plan TOML pipelines; list and describe
// plugins.
#include <spdlog/spdlog.h>
#include <torch/version.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "cli/commands.hpp"
#include "dist/launcher.hpp"
#include "io/error_text.hpp"
#include "io/log.hpp"
#include "io/status_line.hpp"
#include "kiln/abi.h"
#include "plugin/plugin_call.hpp"

namespace {

// FILE and the options after it, checked; throws CLI11's errors so that they read (and exit) as
// any other usage error.
std::vector<std::string> launch_usage(const CLI::App& cmd,
                                      const kiln::dist::LaunchOptions& options) {
  std::vector<std::string> rest = cmd.remaining();
  if (rest.empty()) throw CLI::RequiredError("FILE (the pipeline to run)");
  if (!rest.front().empty() && rest.front().front() == '-') {
    const std::string got = "got '" + rest.front() + "'";
    throw CLI::ValidationError("FILE",
                               "expected the pipeline file before kiln run's options, " + got);
  }
  if (const std::string problem = CLI::ExistingFile(rest.front()); !problem.empty()) {
    throw CLI::ValidationError("FILE", problem);
  }
  if (options.node_rank >= options.nnodes) {
    throw CLI::ValidationError("--node-rank", "must be below --nnodes");
  }
  if (options.nnodes > 1 && options.master_port == 0) {
    throw CLI::ValidationError("--master-port",
                               "an explicit port is required with --nnodes > 1 (every node "
                               "must use the same one)");
  }
  if (options.nnodes > 1 && options.max_restarts > 0) {
    throw CLI::ValidationError("--max-restarts",
                               "restarts a single node's group; across nodes use torchrun "
                               "--rdzv-backend c10d --max-restarts N");
  }
  return rest;
}

// Each rank runs this very executable: `kiln [-v] run FILE …`.
int launch_ranks(const kiln::dist::LaunchOptions& options, const std::vector<std::string>& run_args,
                 bool verbose) {
  std::vector<std::string> argv;
  const bool resumes = std::any_of(run_args.begin(), run_args.end(), [](const std::string& a) {
    return a == "--resume" || a.rfind("--resume=", 0) == 0;
  });
  if (options.max_restarts > 0 && !resumes) {
    spdlog::warn(
        "--max-restarts without --resume auto: a restarted group trains from the start again");
  }
  try {
    std::string self(4096, '\0');
    const ssize_t n = readlink("/proc/self/exe", self.data(), self.size());
    if (n <= 0 || static_cast<size_t>(n) >= self.size()) {
      throw std::runtime_error("cannot find this executable's path in /proc/self/exe");
    }
    self.resize(static_cast<size_t>(n));
    argv.push_back(self);
    if (verbose) argv.emplace_back("-v");
    argv.emplace_back("run");
    argv.insert(argv.end(), run_args.begin(), run_args.end());
    return kiln::dist::launch(options, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

int dispatch(int argc, char** argv) {
  CLI::App app{"Kiln: a C++ training framework on LibTorch with C-ABI plugins"};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");

  kiln::cli::PipelineArgs args;
  std::string metrics;
  auto add_pipeline = [&](CLI::App* cmd) {
    cmd->add_option("file", args.file, "pipeline TOML file")->required()->check(CLI::ExistingFile);
    cmd->add_option("--set", args.overrides, "override a key: --set optimizer.lr=0.05")
        ->take_all()
        ->allow_extra_args(false);
  };
  CLI::App* run = app.add_subcommand("run", "train a pipeline");
  add_pipeline(run);
  run->add_option("--metrics", metrics, "write metrics as JSON lines to this file");
  std::string resume;
  run->add_option("--resume", resume,
                  "continue from a checkpoint: auto (the newest usable one of the newest run "
                  "folder <output_dir>/version_N that has one) or a checkpoint folder; without "
                  "it the run starts afresh in a new run folder");
  CLI::App* evaluate =
      app.add_subcommand("evaluate",
                         "the pipeline's model, with a checkpoint's or a file's weights, on its "
                         "evaluation split: top-1, top-5 and loss");
  add_pipeline(evaluate);
  evaluate->add_option("--metrics", metrics, "write the evaluation to this file, as kiln run does");
  std::string eval_checkpoint, eval_weights;
  auto* eval_from = evaluate->add_option(
      "--checkpoint", eval_checkpoint,
      "a checkpoint folder, or a run or output folder (its newest checkpoint), or auto (the "
      "newest in the pipeline's output folder)");
  evaluate
      ->add_option("--weights", eval_weights,
                   "a safetensors file of the model's weights (as model.init)")
      ->check(CLI::ExistingFile)
      ->excludes(eval_from);
  CLI::App* export_cmd =
      app.add_subcommand("export", "write a checkpoint's model weights as one safetensors file");
  std::string export_from, export_to, export_dtype = "fp32";
  export_cmd
      ->add_option("checkpoint", export_from,
                   "checkpoint folder (…/version_N/checkpoints/step-N), or a run or output "
                   "folder: its newest checkpoint")
      ->required();
  export_cmd->add_option("--to", export_to, "output .safetensors file")->required();
  export_cmd->add_option("--dtype", export_dtype, "floating dtype of the file (default fp32)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16", "keep"}));
  bool export_ema = false;
  export_cmd->add_flag("--ema", export_ema,
                       "the moving average of the weights ([ema]) instead of the trained weights");
  CLI::App* plot_cmd =
      app.add_subcommand("plot", "draw loss, accuracy and lr curves from a metrics file");
  std::string plot_metrics_file, plot_png = "curves.png";
  plot_cmd->add_option("metrics", plot_metrics_file, "metrics written by kiln run --metrics")
      ->required()
      ->check(CLI::ExistingFile);
  plot_cmd->add_option("-o,--output", plot_png, "PNG to write (default curves.png)");
  CLI::App* validate = app.add_subcommand(
      "validate", "check a pipeline without running it: every component is created as a run would");
  add_pipeline(validate);
  int64_t validate_world = 1;
  validate
      ->add_option("--world-size", validate_world,
                   "check for data parallelism over this many ranks (kiln launch's nproc x nnodes)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  CLI::App* plan = app.add_subcommand("plan", "print the resolved pipeline and parameter groups");
  add_pipeline(plan);

  CLI::App* bench = app.add_subcommand(
      "loader-bench", "time the pipeline's training loader alone: images/s and the first batch");
  add_pipeline(bench);
  int64_t bench_batches = 50, bench_warmup = 5;
  bench->add_option("--batches", bench_batches, "batches measured (default 50)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  bench->add_option("--warmup", bench_warmup, "batches taken first, not measured (default 5)")
      ->check(CLI::NonNegativeNumber);

  CLI::App* lr = app.add_subcommand("lr-schedule", "print every group's lr at every iteration");
  add_pipeline(lr);
  int64_t lr_iters = 0;
  bool lr_csv = false;
  std::string lr_png;
  lr->add_option("--iters", lr_iters, "iterations to show (default: the run's length)")
      ->check(CLI::NonNegativeNumber);
  lr->add_flag("--csv", lr_csv, "comma-separated values instead of a table");
  lr->add_option("--png", lr_png, "also write the schedule as a PNG plot");
  std::string lr_metrics;
  lr->add_option("--metrics", lr_metrics,
                 "a run's metrics file: replay its evaluations into a policy that reacts to "
                 "them (plateau)");

  // `kiln launch … FILE [run options]`: everything from FILE on is `kiln run`'s command line.
  CLI::App* launch_cmd =
      app.add_subcommand("launch",
                         "run a pipeline as several local ranks (distributed data "
                         "parallel), like torchrun; FILE and what follows go to kiln run");
  launch_cmd->prefix_command();
  launch_cmd->footer(
      "After the options: FILE [--set key=value ...] [--metrics F] [--resume auto|PATH], the "
      "pipeline and kiln run's options, given to every rank.");
  kiln::dist::LaunchOptions launch_options;
  launch_cmd->add_option("--nproc", launch_options.nproc, "ranks on this node")
      ->required()
      ->check(CLI::Range(1, 1 << 16));
  launch_cmd->add_option("--nnodes", launch_options.nnodes, "nodes in the run (default 1)")
      ->check(CLI::Range(1, 1 << 16));
  launch_cmd->add_option("--node-rank", launch_options.node_rank, "this node's index (default 0)")
      ->check(CLI::NonNegativeNumber);
  launch_cmd->add_option("--master-addr", launch_options.master_addr,
                         "host of rank 0 (default 127.0.0.1)");
  launch_cmd
      ->add_option("--master-port", launch_options.master_port,
                   "port of rank 0's store (default: a free one; required with --nnodes > 1)")
      ->check(CLI::Range(0, 65535));
  launch_cmd
      ->add_option("--grace", launch_options.grace_seconds,
                   "seconds between SIGTERM and SIGKILL for the other ranks when one fails")
      ->check(CLI::NonNegativeNumber);
  launch_cmd
      ->add_option("--max-restarts", launch_options.max_restarts,
                   "start the whole group again up to N times when a rank fails, as torchrun "
                   "--max-restarts (default 0; pass --resume auto to continue from the newest "
                   "checkpoint; one node only)")
      ->check(CLI::Range(0, 1 << 20));
  std::vector<std::string> launch_run_args;  // FILE and kiln run's options

  CLI::App* config_docs =
      app.add_subcommand("config-docs", "print the configuration reference (docs/config.md)");

  CLI::App* plugins = app.add_subcommand("plugins", "inspect plugins");
  plugins->require_subcommand(1);
  std::vector<std::string> plugin_dirs;
  plugins->add_option("--plugin-path", plugin_dirs, "extra plugin folder (repeatable)");
  CLI::App* list = plugins->add_subcommand("list", "name, kind, version and path of every plugin");
  std::string describe_name;
  CLI::App* describe = plugins->add_subcommand("describe", "capabilities and options of one");
  describe->add_option("name", describe_name, "component name")->required();
  CLI::App* version = app.add_subcommand("version", "versions of Kiln, its ABI and LibTorch");

  try {
    app.parse(argc, argv);
    if (*launch_cmd) launch_run_args = launch_usage(*launch_cmd, launch_options);
  } catch (const CLI::ParseError& e) {
    // Help is a success; any other command-line mistake is a usage error (exit code 2, as
    // configuration errors), not CLI11's own numbering.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  // The terminal's status line (the progress bar of `kiln run`), which every log line erases
  // first; the command's logger and the trainer use it while this call lasts.
  kiln::io::StatusLine terminal(stderr);
  const kiln::io::CliLogging logging(verbose, terminal);

  if (*launch_cmd) return launch_ranks(launch_options, launch_run_args, verbose);
  if (*run) return kiln::cli::run(args, metrics, resume, terminal);
  if (*evaluate) return kiln::cli::evaluate(args, eval_checkpoint, eval_weights, metrics);
  if (*plot_cmd) return kiln::cli::plot(plot_metrics_file, plot_png);
  if (*export_cmd)
    return kiln::cli::export_weights(export_from, export_to, export_dtype, export_ema);
  if (*validate) return kiln::cli::validate(args, validate_world);
  if (*plan) return kiln::cli::plan(args);
  if (*bench) return kiln::cli::loader_bench(args, bench_batches, bench_warmup);
  if (*lr) return kiln::cli::lr_schedule(args, lr_iters, lr_csv, lr_png, lr_metrics);
  if (*config_docs) return kiln::cli::config_docs();
  if (*list) return kiln::cli::plugins_list(plugin_dirs);
  if (*describe) return kiln::cli::plugins_describe(describe_name, plugin_dirs);
  if (*version) {
    std::printf("kiln 0.1.0, plugin ABI %d.%d, LibTorch %s\n", KILN_ABI_MAJOR, KILN_ABI_MINOR,
                TORCH_VERSION);
    return 0;
  }
  return 2;
}

}  // namespace

// Every command runs inside one backstop: an exception that escaped everything else (whatever
// its type) ends the command as a run-time failure with its text, never as std::terminate.
int main(int argc, char** argv) {
  try {
    return dispatch(argc, argv);
  } catch (...) {
    const std::string text =
        kiln::io::without_backtrace(kiln::plugin::describe_current_exception());
    std::fprintf(stderr, "error: %s\n", text.c_str());
    return 1;
  }
}
