// Line plots written as PNG: learning-rate schedules and training curves. The axes are computed
// here (plot_axes.cpp); the drawing is cairo's, in the module libkiln_plot that write_plot loads
// (plot.cpp, plot_png.cpp), so that `kiln` starts without cairo's X11 libraries.
#pragma once

#include <limits>
#include <string>
#include <vector>

namespace kiln::io {

struct Series {
  std::string label;
  std::vector<double> x, y;
  bool markers = false;  // also a dot at every point: sparse series (one per evaluation)
};

struct Panel {
  std::string title;
  std::string x_label, y_label;
  std::vector<Series> series;
  bool whole_x = false;  // x counts whole things (epochs): ticks on whole numbers only
  // Bounds the y axis never passes, padding included (a percentage stays within [0, 100]).
  double y_floor = -std::numeric_limits<double>::infinity();
  double y_ceiling = std::numeric_limits<double>::infinity();
};

// An axis as drawn: its range and its tick values.
struct Axis {
  double lo = 0.0, hi = 1.0;
  std::vector<double> ticks;
};
Axis x_axis(const Panel& panel);
Axis y_axis(const Panel& panel);

// Writes `panels` stacked vertically into one PNG at `path`. Throws std::runtime_error with the
// path and cairo's reason when it cannot, or with the loader's when libkiln_plot does not load.
void write_plot(const std::string& path, const std::vector<Panel>& panels, int width = 900,
                int panel_height = 360);

}  // namespace kiln::io
