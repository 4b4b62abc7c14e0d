#include "io/progress.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::io {
namespace {

constexpr int kMinBarCells = 10;
constexpr int kMaxBarCells = 40;  // wider terminals get whitespace, not a longer bar

std::string bar(double fraction, int cells) {
  const int filled = std::clamp(static_cast<int>(std::floor(fraction * cells)), 0, cells);
  return "[" + std::string(static_cast<size_t>(filled), '#') +
         std::string(static_cast<size_t>(cells - filled), '.') + "]";
}

}  // namespace

double eta_seconds(const ProgressState& s) {
  const int64_t taken = s.step - s.first_step;
  return taken > 0
             ? s.elapsed / static_cast<double>(taken) * static_cast<double>(s.total_steps - s.step)
             : NAN;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t total = std::llround(seconds);
  int64_t h = total / 3600, m = (total / 60) % 60, s = total % 60;
  return h > 0 ? fmt::format("{}:{:02}:{:02}", h, m, s) : fmt::format("{}:{:02}", m, s);
}

std::string format_progress(const ProgressState& s) {
  return fmt::format("epoch {}/{}  step {}/{}  loss {:.4f}  lr {:.4g}  {:.0f} samples/s  ETA {}",
                     s.epoch, s.epochs, s.step, s.total_steps, s.loss, s.lr, s.samples_per_s,
                     format_duration(eta_seconds(s)));
}

std::string format_progress_bar(const ProgressState& s, int width) {
  if (width <= 0) return {};
  const double fraction =
      s.total_steps > 0
          ? std::clamp(static_cast<double>(s.step) / static_cast<double>(s.total_steps), 0.0, 1.0)
          : 0.0;
  const std::string percent = fmt::format("{:3.0f}%", std::floor(fraction * 100.0));

  // Pieces in display order; `drop` ranks them for removal when the line is too long (1 goes
  // first, 0 never).
  struct Field {
    std::string text;
    int drop;
  };
  const std::string epoch = fmt::format("epoch {}/{}", s.epoch, s.epochs);
  std::vector<Field> fields = {
      {fmt::format("step {}/{}", s.step, s.total_steps), 3},
      {fmt::format("loss {:.4f}", s.loss), 5},
      {fmt::format("lr {:.4g}", s.lr), 2},
      {fmt::format("{:.0f} samples/s", s.samples_per_s), 1},
      {"ETA " + format_duration(eta_seconds(s)), 0},
  };
  bool with_epoch = true, with_bar = true;

  // Everything but the bar's cells: "epoch 1/3 [" + "]  42%" + "  field" for each field.
  auto fixed = [&] {
    int n = static_cast<int>(percent.size());
    if (with_epoch) n += static_cast<int>(epoch.size()) + 1;
    if (with_bar) n += 2 + 1;  // brackets and the gap before the percentage
    for (const Field& f : fields) n += 2 + static_cast<int>(f.text.size());
    return n;
  };
  for (int rank = 1; fixed() + (with_bar ? kMinBarCells : 0) > width; ++rank) {
    if (rank == 4) {
      with_epoch = false;
    } else if (rank == 6) {
      with_bar = false;
    } else if (rank > 6) {
      break;
    } else {
      fields.erase(std::remove_if(fields.begin(), fields.end(),
                                  [&](const Field& f) { return f.drop == rank; }),
                   fields.end());
    }
  }

  std::string line;
  if (with_epoch) line += epoch + " ";
  if (with_bar) {
    line += bar(fraction, std::clamp(width - fixed(), kMinBarCells, kMaxBarCells)) + " ";
  }
  // The percentage is padded to line up under a bar; alone it starts the line unpadded.
  line += line.empty() ? percent.substr(percent.find_first_not_of(' ')) : percent;
  for (const Field& f : fields) line += "  " + f.text;
  if (static_cast<int>(line.size()) > width) line.resize(static_cast<size_t>(width));
  return line;
}

}  // namespace kiln::io
