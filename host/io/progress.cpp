#include "io/progress.hpp"

#include <fmt/format.h>

#include <cmath>

namespace kiln::io {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto total = static_cast<int64_t>(seconds + 0.5);
  int64_t h = total / 3600, m = (total / 60) % 60, s = total % 60;
  return h > 0 ? fmt::format("{}:{:02}:{:02}", h, m, s) : fmt::format("{}:{:02}", m, s);
}

std::string format_progress(const ProgressState& s) {
  double eta = s.step > 0 ? s.elapsed / static_cast<double>(s.step) *
                                static_cast<double>(s.total_steps - s.step)
                          : NAN;
  return fmt::format("epoch {}/{}  step {}/{}  loss {:.4f}  lr {:.4g}  {:.0f} samples/s  ETA {}",
                     s.epoch, s.epochs, s.step, s.total_steps, s.loss, s.lr, s.samples_per_s,
                     format_duration(eta));
}

}  // namespace kiln::io
