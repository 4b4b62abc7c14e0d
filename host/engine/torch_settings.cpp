#include "engine/torch_settings.hpp"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>

#include <string>

namespace kiln::engine {

void apply_torch_settings(const config::RunSettings& run) {
  if (run.threads > 0) at::set_num_threads(static_cast<int>(run.threads));
  if (run.tf32 != "default") {
    const bool tf32 = run.tf32 == "on";
    at::globalContext().setAllowTF32CuBLAS(tf32);
    at::globalContext().setAllowTF32CuDNN(tf32);
  }
  // Training shapes are static batch after batch: one timing pass per shape buys the fastest
  // convolution algorithm for the whole run.
  at::globalContext().setBenchmarkCuDNN(run.cudnn_benchmark);
}

void report_torch_settings_left(const config::RunSettings& run) {
  std::string left;
  if (run.threads > 0) left += "run.threads = " + std::to_string(run.threads);
  if (run.tf32 != "default") {
    left += (left.empty() ? "" : ", ") + std::string("run.tf32 = \"") + run.tf32 + "\"";
  }
  if (left.empty()) return;
  spdlog::info(
      "{} not applied: they change the whole process, which this session was not allowed to "
      "(kiln_session_options.process_settings)",
      left);
}

}  // namespace kiln::engine
