#include "io/metrics_plot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "io/plot.hpp"

namespace kiln::io {
namespace {

using Json = nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Errors of one line: "metrics.jsonl:12: ...".
struct LineContext {
  const std::string& path;
  size_t line;
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(fmt::format("{}:{}: {}", path, line, what));
  }
};

// A number, or NaN for a null (the writer's non-finite values) or an absent field.
double number_of(const LineContext& where, const std::string& key, const Json& value) {
  if (value.is_null()) return kNaN;
  if (!value.is_number()) {
    where.fail(fmt::format("\"{}\" is not a number: {}", key,
                           value.is_string() ? value.get<std::string>() : value.dump()));
  }
  return value.get<double>();
}

double number(const LineContext& where, const Json& obj, const std::string& key) {
  const auto it = obj.find(key);
  return it == obj.end() ? kNaN : number_of(where, key, *it);
}

int64_t integer(const LineContext& where, const Json& obj, const std::string& key) {
  const double v = number(where, obj, key);
  if (!std::isfinite(v) || v != std::floor(v)) {
    where.fail(fmt::format("\"{}\" must be an integer", key));
  }
  return static_cast<int64_t>(v);
}

std::vector<std::string> strings(const Json& obj, const std::string& key) {
  std::vector<std::string> out;
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_array()) return out;
  for (const Json& item : *it)
    out.push_back(item.is_string() ? item.get<std::string>() : item.dump());
  return out;
}

// An array of numbers; a single number where an array was expected is one group.
std::vector<double> numbers(const LineContext& where, const Json& obj, const std::string& key) {
  std::vector<double> out;
  const auto it = obj.find(key);
  if (it == obj.end()) return out;
  if (!it->is_array()) return {number_of(where, key, *it)};
  for (const Json& item : *it) out.push_back(number_of(where, key, item));
  return out;
}

// Trailing mean over `window` steps, ignoring non-finite losses (NaN where a window has none).
std::vector<double> moving_mean(const std::vector<double>& y, size_t window) {
  std::vector<double> out(y.size(), kNaN);
  double sum = 0.0;
  size_t count = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (std::isfinite(y[i])) sum += y[i], ++count;
    if (i >= window && std::isfinite(y[i - window])) sum -= y[i - window], --count;
    if (count > 0) out[i] = sum / static_cast<double>(count);
  }
  return out;
}

}  // namespace

MetricsLog read_metrics(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open metrics file: " + std::strerror(errno));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  MetricsLog log;
  size_t begin = 0;
  for (size_t line_no = 1; begin < text.size(); ++line_no) {
    size_t end = text.find('\n', begin);
    const bool complete = end != std::string::npos;
    if (!complete) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;

    const LineContext where{path, line_no};
    Json obj;
    try {
      obj = Json::parse(line);
    } catch (const Json::parse_error& e) {
      if (!complete) break;  // the trainer is still writing it
      where.fail(std::string("bad JSON: ") + e.what());
    }
    const auto type_field = obj.find("type");
    if (type_field == obj.end() || !type_field->is_string()) where.fail("no \"type\"");
    const std::string type = type_field->get<std::string>();
    if (type == "step") {
      MetricsStep s;
      s.step = integer(where, obj, "step");
      s.epoch = obj.contains("epoch") ? integer(where, obj, "epoch") : 0;
      s.loss = number(where, obj, "loss");
      s.lr = numbers(where, obj, "lr");
      s.loss_scale = number(where, obj, "loss_scale");
      s.grad_norm = number(where, obj, "grad_norm");
      s.skipped = obj.value("skipped", Json(false)) == true;
      std::vector<std::string> names = strings(obj, "lr_groups");
      if (!names.empty()) log.lr_groups = std::move(names);
      // A resumed run repeats the steps after its checkpoint, and the evaluations among them.
      while (!log.steps.empty() && log.steps.back().step >= s.step) log.steps.pop_back();
      while (!log.evals.empty() && log.evals.back().step >= s.step) log.evals.pop_back();
      log.steps.push_back(std::move(s));
    } else if (type == "eval") {
      MetricsEval e;
      e.epoch = integer(where, obj, "epoch");
      e.step = integer(where, obj, "step");
      e.accuracy = number(where, obj, "accuracy");
      e.loss = number(where, obj, "loss");
      e.top5 = number(where, obj, "top5");
      e.map = number(where, obj, "map");
      while (!log.evals.empty() && log.evals.back().step >= e.step) log.evals.pop_back();
      log.evals.push_back(e);
    }
  }
  if (log.steps.empty()) throw std::runtime_error(path + ": no step records");
  return log;
}

std::vector<Panel> metrics_panels(const MetricsLog& log) {
  std::vector<Panel> panels;

  std::vector<double> steps, losses;
  for (const MetricsStep& s : log.steps) {
    steps.push_back(static_cast<double>(s.step));
    losses.push_back(s.loss);
  }
  std::vector<double> eval_steps, eval_epochs, eval_losses, accuracies;
  // Multi-label runs report mean average precision where others report accuracy.
  const bool multi_label = !log.evals.empty() && !std::isnan(log.evals.back().map);
  for (const MetricsEval& e : log.evals) {
    eval_steps.push_back(static_cast<double>(e.step));
    eval_epochs.push_back(static_cast<double>(e.epoch));
    eval_losses.push_back(e.loss);
    accuracies.push_back(100.0 * (multi_label ? e.map : e.accuracy));
  }

  Panel loss{"Loss", "step", "loss", {{"training loss", steps, losses}}};
  // About a tenth of the run, so the trend shows through batch-to-batch noise.
  const size_t window = std::clamp<size_t>(steps.size() / 10, 1, 100);
  if (window > 1) {
    loss.series.push_back(
        {fmt::format("mean of {} steps", window), steps, moving_mean(losses, window)});
  }
  if (!log.evals.empty()) loss.series.push_back({"test loss", eval_steps, eval_losses, true});
  panels.push_back(std::move(loss));

  if (!log.evals.empty()) {
    const char* what = multi_label ? "test mAP" : "test accuracy";
    Panel accuracy{
        multi_label ? "Test mean average precision per evaluation" : "Test accuracy per evaluation",
        "epoch",
        "%",
        {{what, eval_epochs, accuracies, true}}};
    accuracy.whole_x = true;
    accuracy.y_floor = 0.0;
    accuracy.y_ceiling = 100.0;
    panels.push_back(std::move(accuracy));
  }

  size_t groups = 0;
  for (const MetricsStep& s : log.steps) groups = std::max(groups, s.lr.size());
  if (groups > 0) {
    Panel lr{"Learning rate per group", "step", "lr", {}};
    for (size_t g = 0; g < groups; ++g) {
      // The names `kiln lr-schedule` and TensorBoard use; older files have none.
      Series series{
          g < log.lr_groups.size() ? log.lr_groups[g] : fmt::format("group {}", g), steps, {}};
      for (const MetricsStep& s : log.steps) series.y.push_back(g < s.lr.size() ? s.lr[g] : kNaN);
      lr.series.push_back(std::move(series));
    }
    panels.push_back(std::move(lr));
  }

  // Dynamic loss scaling halves and doubles: log2 shows each change as one unit.
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  std::vector<double> log_scale;
  for (const MetricsStep& s : log.steps) {
    log_scale.push_back(s.loss_scale > 0 ? std::log2(s.loss_scale) : kNaN);
    if (std::isfinite(log_scale.back())) {
      lo = std::min(lo, log_scale.back());
      hi = std::max(hi, log_scale.back());
    }
  }
  if (lo < hi) {
    panels.push_back(Panel{"Loss scale", "step", "log2 scale", {{"loss scale", steps, log_scale}}});
  }
  return panels;
}

void plot_metrics(const std::string& metrics_path, const std::string& png_path) {
  write_plot(png_path, metrics_panels(read_metrics(metrics_path)));
}

}  // namespace kiln::io
