// The axes of a plot: ranges and round tick values (no drawing, no cairo).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "io/plot.hpp"

namespace kiln::io {
namespace {

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  void settle() {
    if (!(lo <= hi)) lo = 0, hi = 1;
    if (hi - lo < 1e-12 * std::max(1.0, std::abs(hi))) {
      const double pad = std::max(1e-12, std::abs(hi) * 0.05);
      lo -= pad;
      hi += pad;
    }
  }
};

// About five round tick values covering [lo, hi]; whole numbers only when `whole`.
std::vector<double> ticks(double lo, double hi, bool whole) {
  const double raw = (hi - lo) / 5.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (raw <= step) break;
  }
  if (whole) step = std::max(step, 1.0);
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    out.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return out;
}

}  // namespace

Axis x_axis(const Panel& panel) {
  Range r;
  for (const auto& s : panel.series) {
    for (double v : s.x) r.add(v);
  }
  r.settle();
  return {r.lo, r.hi, ticks(r.lo, r.hi, panel.whole_x)};
}

Axis y_axis(const Panel& panel) {
  Range r;
  for (const auto& s : panel.series) {
    for (double v : s.y) r.add(v);
  }
  r.settle();
  // Padding around a flat series stops at the bounds (an accuracy of 100% stays under 100%).
  r.lo = std::max(r.lo, panel.y_floor);
  r.hi = std::min(r.hi, panel.y_ceiling);
  if (!(r.lo < r.hi)) r.settle();
  return {r.lo, r.hi, ticks(r.lo, r.hi, false)};
}

}  // namespace kiln::io
