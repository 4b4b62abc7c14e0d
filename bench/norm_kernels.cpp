// bench_norm_kernels: one batch-norm + ReLU layer's training forward and backward, the batchnorm
// plugin through the host's norm layer with its fused CPU kernels (norm.fused = true) against the
// same plugin on ATen's kernels with the host's ReLU (norm.fused = false), per shape and memory
// format. Alternating runs, the median of each. See docs/benchmarks.md.
//   bench_norm_kernels [--threads N] [--iters N] [--runs N] [--shapes NxCxHxW,...]
#include <ATen/Functions.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/norm_layer.hpp"

namespace {

const kiln::plugin::Component& batchnorm(const std::string& dir) {
  static kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
  static kiln::plugin::Registry registry;
  if (registry.find(KILN_COMPONENT_NORM, "batchnorm") == nullptr) {
    loader.load_library(dir + "/libkiln_batchnorm.so", registry);
  }
  return *registry.find(KILN_COMPONENT_NORM, "batchnorm");
}

kiln::config::OptionSet options(bool fused) {
  kiln::config::OptionSet o;
  kiln::config::Value b;
  b.type = KILN_OPT_BOOL;
  b.bool_value = fused;
  o.set("fused", b);
  return o;
}

// Milliseconds per forward + backward, `iters` of them after two unmeasured.
double time_layer(kiln::plugin::PluginNormLayer& layer, const at::Tensor& x, const at::Tensor& g,
                  int iters) {
  auto once = [&] {
    at::Tensor xi = x.detach().requires_grad_();
    layer.forward(xi).backward(g);
  };
  once();
  once();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) once();
  const std::chrono::duration<double, std::milli> dt = std::chrono::steady_clock::now() - t0;
  return dt.count() / iters;
}

std::vector<std::vector<int64_t>> parse_shapes(const std::string& s) {
  std::vector<std::vector<int64_t>> out;
  std::stringstream all(s);
  std::string one;
  while (std::getline(all, one, ',')) {
    std::vector<int64_t> shape;
    std::stringstream dims(one);
    std::string d;
    while (std::getline(dims, d, 'x')) shape.push_back(std::stoll(d));
    out.push_back(shape);
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 50, runs = 5;
  // The quickstart ResNet's batch-norm layers at batch 128, then resnet18's at batch 32.
  std::string shapes = "128x16x28x28,128x32x14x14,128x64x7x7,32x64x32x32,32x128x16x16,32x512x4x4";
  std::string plugins = KILN_BENCH_PLUGIN_DIR;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (key == "--iters")
      iters = std::atoi(argv[i + 1]);
    else if (key == "--runs")
      runs = std::atoi(argv[i + 1]);
    else if (key == "--shapes")
      shapes = argv[i + 1];
    else if (key == "--plugins")
      plugins = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  at::set_num_threads(threads);
  std::printf(
      "| shape | layout | ATen + ReLU ms | fused ms | ATen ÷ fused |\n|---|---|---:|---:|---:|\n");
  for (const auto& shape : parse_shapes(shapes)) {
    for (bool cl : {false, true}) {
      if (cl && shape.size() != 4) continue;
      kiln_norm_request request{sizeof(kiln_norm_request), shape[1], KILN_ACT_RELU, 0, 0.0};
      kiln::plugin::PluginNormLayer fused(batchnorm(plugins), options(true), request);
      kiln::plugin::PluginNormLayer aten(batchnorm(plugins), options(false), request);
      at::Tensor x = at::randn(shape), g = at::randn(shape);
      if (cl) {
        x = x.contiguous(at::MemoryFormat::ChannelsLast);
        g = g.contiguous(at::MemoryFormat::ChannelsLast);
      }
      std::vector<double> ta, tf;
      for (int r = 0; r < runs; ++r) {
        ta.push_back(time_layer(aten, x, g, iters));
        tf.push_back(time_layer(fused, x, g, iters));
      }
      std::string name;
      for (int64_t d : shape) name += std::to_string(d) + "x";
      name.pop_back();
      std::printf("| %s | %s | %.3f | %.3f | %.2f |\n", name.c_str(),
                  cl ? "channels_last" : "contiguous", median(ta), median(tf),
                  median(ta) / median(tf));
    }
  }
  return 0;
}
