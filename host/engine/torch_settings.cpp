#include "engine/torch_settings.hpp"

#include <ATen/Context.h>
#include <ATen/Parallel.h>

namespace kiln::engine {

void apply_torch_settings(const config::OptionSet& run) {
  if (run.get_int("threads") > 0) at::set_num_threads(static_cast<int>(run.get_int("threads")));
  if (run.get_string("tf32") != "default") {
    const bool tf32 = run.get_string("tf32") == "on";
    at::globalContext().setAllowTF32CuBLAS(tf32);
    at::globalContext().setAllowTF32CuDNN(tf32);
  }
  // Training shapes are static batch after batch: one timing pass per shape buys the fastest
  // convolution algorithm for the whole run.
  at::globalContext().setBenchmarkCuDNN(run.get_bool("cudnn_benchmark"));
}

}  // namespace kiln::engine
