// The call between write_plot (in `kiln`) and libkiln_plot, the module that draws with cairo.
// Both are built together from this tree, so C++ types may cross; the entry point is
// extern "C" only so that dlsym finds it by a plain name, and no exception crosses it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "io/plot.hpp"

namespace kiln::io {

struct PlotRequest {
  const std::string* path;
  const std::vector<Panel>* panels;
  int width;
  int panel_height;
};

// libkiln_plot's file name and entry point: 0 when the PNG was written, else nonzero with the
// reason in `error` (at most error_size bytes, NUL-terminated).
constexpr const char* kPlotModule = "libkiln_plot.so";
constexpr const char* kPlotEntry = "kiln_plot_write_png";
using PlotEntry = int (*)(const PlotRequest* request, char* error, size_t error_size);

}  // namespace kiln::io
