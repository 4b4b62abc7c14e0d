#include "io/plot.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/plot_module.hpp"

namespace kiln::io {
namespace {

// The folder of the file holding this code (`kiln`, or a test), and of the running executable.
std::vector<std::string> homes() {
  std::vector<std::string> out;
  auto add_folder_of = [&](const std::string& file) {
    const size_t slash = file.rfind('/');
    if (slash != std::string::npos) out.push_back(file.substr(0, slash));
  };
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&homes), &info) != 0 && info.dli_fname != nullptr) {
    add_folder_of(info.dli_fname);
  }
  std::array<char, 4096> exe{};
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  if (n > 0) add_folder_of(std::string(exe.data(), static_cast<size_t>(n)));
  return out;
}

// libkiln_plot beside `kiln` (bin/../lib: the build tree, an install prefix, the wheel), else
// by name (LD_LIBRARY_PATH, the caller's RUNPATH). Never unloaded: cairo and fontconfig keep
// process state. Throws std::runtime_error with every reason when none loads.
void* load_plot_module() {
  std::string reasons;
  std::vector<std::string> candidates;
  for (const std::string& home : homes()) {
    candidates.push_back(home + "/../lib/" + kPlotModule);
    candidates.push_back(home + "/" + kPlotModule);
  }
  candidates.emplace_back(kPlotModule);
  for (const std::string& candidate : candidates) {
    if (candidate.find('/') != std::string::npos && access(candidate.c_str(), F_OK) != 0) continue;
    if (void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) {
      return handle;
    }
    const char* why = dlerror();
    reasons += std::string("\n  ") + (why != nullptr ? why : candidate + ": cannot be loaded");
  }
  throw std::runtime_error(std::string("plotting needs ") + kPlotModule +
                           " (cairo), which did not load:" + reasons);
}

}  // namespace

void write_plot(const std::string& path, const std::vector<Panel>& panels, int width,
                int panel_height) {
  void* module = load_plot_module();
  auto entry = reinterpret_cast<PlotEntry>(dlsym(module, kPlotEntry));
  if (entry == nullptr) {
    throw std::runtime_error(std::string(kPlotModule) + " has no " + kPlotEntry);
  }
  const PlotRequest request{&path, &panels, width, panel_height};
  std::array<char, 1024> error{};
  if (entry(&request, error.data(), error.size()) != 0) throw std::runtime_error(error.data());
}

}  // namespace kiln::io
