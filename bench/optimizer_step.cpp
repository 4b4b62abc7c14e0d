// bench_optimizer_step: the C++ side of bench/optimizer_step.py. Holds ResNet-50's parameters and
// times optimizer steps on request, so the driver can alternate these arms with torch.optim in
// Python under the same thread settings. The process is set up as `kiln run` sets up its own
// (host/engine/trainer.cpp): Kiln's CPU tensor allocator at start-up, glibc's heap tuned once the
// set-up is built (docs/speed.md, "The C heap"); --tune-heap 0 and --kiln-allocator 0 leave
// glibc's and c10's defaults. A line protocol on stdin/stdout:
//   startup    -> {"params": [[name, [dims...]], ...], "plugin_dir": ..., "threads": N,
//                  "tune_heap": bool, "kiln_allocator": bool, "refused": [...]}
//   setup ARM  -> "ok DESCRIPTION" | "skip REASON"     ARM: kiln-OPTIMIZER (sgd, adamw, lion,
//   run ARM N  -> "ms MEAN_MS_PER_STEP"                     nadam, ..., muon, lookahead: see
//   free ARM   -> "ok"                                      arms.cpp), torch-cpp-sgd,
//                                                           torch-cpp-adamw, torch-cpp-adagrad
//   quit
// Any failure answers "error MESSAGE".
#include <ATen/Parallel.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "arms.hpp"
#include "io/heap.hpp"
#include "io/memory.hpp"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"

namespace {

using kiln::bench::Arm;

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// <dir of this executable>/../plugins: the built-in plugin folder of the build tree.
std::string default_plugin_dir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "plugins";
  std::string exe(buf, static_cast<size_t>(n));
  return exe.substr(0, exe.rfind('/')) + "/../plugins";
}

std::unique_ptr<Arm> make_arm(const std::string& arm, const kiln::plugin::Registry& registry,
                              const kiln::bench::Workload& work, std::string& skip) {
  if (arm.rfind("kiln-", 0) == 0) {
    const std::string optimizer = arm.substr(5);
    return make_kiln_arm(registry, optimizer, kiln::bench::workload_for(optimizer, work), skip);
  }
  if (arm.rfind("torch-cpp-", 0) == 0) {
    const std::string optimizer = arm.substr(10);
    return kiln::bench::make_torch_arm(optimizer, kiln::bench::workload_for(optimizer, work));
  }
  throw std::runtime_error("unknown arm '" + arm + "'");
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  bool tune_heap = true, kiln_allocator = true;
  std::string plugin_dir = default_plugin_dir();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--threads") {
      threads = std::stoi(value);
    } else if (flag == "--plugin-dir") {
      plugin_dir = value;
    } else if (flag == "--tune-heap" && (value == "0" || value == "1")) {
      tune_heap = value == "1";
    } else if (flag == "--kiln-allocator" && (value == "0" || value == "1")) {
      kiln_allocator = value == "1";
    } else {
      std::cerr << "usage: bench_optimizer_step [--threads N] [--plugin-dir DIR] [--tune-heap 1] "
                   "[--kiln-allocator 1]\n";
      return 2;
    }
  }
  // As the Trainer does: the allocator before any tensor that matters.
  if (kiln_allocator) kiln::io::count_cpu_tensor_memory();
  at::set_num_threads(threads);

  kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
  kiln::plugin::Registry registry;
  std::vector<std::string> refused;
  loader.load_directory(plugin_dir, registry, refused);
  const kiln::bench::Workload work = kiln::bench::make_workload();
  // As the Trainer does once its set-up is built; false where the user's MALLOC_* or
  // GLIBC_TUNABLES settings win.
  if (tune_heap) tune_heap = kiln::io::tune_heap_for_training();

  std::ostringstream hello;
  hello << "{\"params\": [";
  for (size_t i = 0; i < work.names.size(); ++i) {
    hello << (i ? ", [" : "[") << json_string(work.names[i]) << ", [";
    for (int64_t d = 0; d < work.init[i].dim(); ++d)
      hello << (d ? ", " : "") << work.init[i].size(d);
    hello << "]]";
  }
  hello << "], \"plugin_dir\": " << json_string(plugin_dir)
        << ", \"threads\": " << at::get_num_threads()
        << ", \"tune_heap\": " << (tune_heap ? "true" : "false")
        << ", \"kiln_allocator\": " << (kiln_allocator ? "true" : "false") << ", \"refused\": [";
  for (size_t i = 0; i < refused.size(); ++i) hello << (i ? ", " : "") << json_string(refused[i]);
  hello << "]}";
  std::cout << hello.str() << std::endl;

  std::map<std::string, std::unique_ptr<Arm>> arms;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command, name;
    in >> command >> name;
    if (command == "quit") break;
    try {
      if (command == "setup") {
        std::string skip;
        auto arm = make_arm(name, registry, work, skip);
        if (!arm) {
          std::cout << "skip " << skip << std::endl;
          continue;
        }
        std::cout << "ok " << arm->description() << std::endl;
        arms[name] = std::move(arm);
      } else if (command == "run") {
        int steps = 0;
        in >> steps;
        Arm& arm = *arms.at(name);
        const auto start = std::chrono::steady_clock::now();
        for (int s = 0; s < steps; ++s) arm.step();
        const std::chrono::duration<double, std::milli> elapsed =
            std::chrono::steady_clock::now() - start;
        std::printf("ms %.6f\n", elapsed.count() / std::max(steps, 1));
        std::fflush(stdout);
      } else if (command == "free") {
        arms.erase(name);
        std::cout << "ok" << std::endl;
      } else {
        throw std::runtime_error("unknown command '" + command + "'");
      }
    } catch (const std::exception& e) {
      std::string message = e.what();
      for (char& c : message) c = c == '\n' ? ' ' : c;
      std::cout << "error " << message << std::endl;
    }
  }
  return 0;
}
