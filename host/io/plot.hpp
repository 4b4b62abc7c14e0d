// Line plots written as PNG (cairo): learning-rate schedules and training curves.
#pragma once

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
};

// Writes `panels` stacked vertically into one PNG at `path`. Throws std::runtime_error with the
// path and cairo's reason when it cannot.
void write_plot(const std::string& path, const std::vector<Panel>& panels, int width = 900,
                int panel_height = 360);

}  // namespace kiln::io
