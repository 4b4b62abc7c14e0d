// `kiln`: run, validate and plan TOML pipelines; list and describe plugins.
#include <torch/version.h>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "io/log.hpp"
#include "kiln/abi.h"

int main(int argc, char** argv) {
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
                  "continue from a checkpoint: auto (the newest usable one under "
                  "<output_dir>/checkpoints) or a checkpoint folder");
  CLI::App* export_cmd =
      app.add_subcommand("export", "write a checkpoint's model weights as one safetensors file");
  std::string export_from, export_to, export_dtype = "fp32";
  export_cmd->add_option("checkpoint", export_from, "checkpoint folder (…/checkpoints/step-N)")
      ->required();
  export_cmd->add_option("--to", export_to, "output .safetensors file")->required();
  export_cmd->add_option("--dtype", export_dtype, "floating dtype of the file (default fp32)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16", "keep"}));
  CLI::App* plot_cmd =
      app.add_subcommand("plot", "draw loss, accuracy and lr curves from a metrics file");
  std::string plot_metrics_file, plot_png = "curves.png";
  plot_cmd->add_option("metrics", plot_metrics_file, "metrics written by kiln run --metrics")
      ->required()
      ->check(CLI::ExistingFile);
  plot_cmd->add_option("-o,--output", plot_png, "PNG to write (default curves.png)");
  CLI::App* validate = app.add_subcommand("validate", "check a pipeline without running it");
  add_pipeline(validate);
  CLI::App* plan = app.add_subcommand("plan", "print the resolved pipeline and parameter groups");
  add_pipeline(plan);

  CLI::App* lr = app.add_subcommand("lr-schedule", "print every group's lr at every iteration");
  add_pipeline(lr);
  int64_t lr_iters = 0;
  bool lr_csv = false;
  std::string lr_png;
  lr->add_option("--iters", lr_iters, "iterations to show (default: the run's length)")
      ->check(CLI::NonNegativeNumber);
  lr->add_flag("--csv", lr_csv, "comma-separated values instead of a table");
  lr->add_option("--png", lr_png, "also write the schedule as a PNG plot");

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
  } catch (const CLI::ParseError& e) {
    // Help is a success; any other command-line mistake is a usage error (exit code 2, as
    // configuration errors), not CLI11's own numbering.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  kiln::io::setup_logging(verbose);

  if (*run) return kiln::cli::run(args, metrics, resume);
  if (*plot_cmd) return kiln::cli::plot(plot_metrics_file, plot_png);
  if (*export_cmd) return kiln::cli::export_weights(export_from, export_to, export_dtype);
  if (*validate) return kiln::cli::validate(args);
  if (*plan) return kiln::cli::plan(args);
  if (*lr) return kiln::cli::lr_schedule(args, lr_iters, lr_csv, lr_png);
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
