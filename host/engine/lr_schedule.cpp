#include "engine/lr_schedule.hpp"

#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "engine/param_groups.hpp"
#include "engine/plan.hpp"
#include "engine/run_data.hpp"
#include "io/metrics_plot.hpp"
#include "io/plot.hpp"
#include "kiln/torch.hpp"

namespace kiln::engine {

int64_t train_batches_per_epoch(const config::Pipeline& p) {
  return batches_per_epoch(p.settings.data, *open_train_split(p), /*world_size=*/1);
}

LrTable lr_table(const config::Pipeline& p, int64_t iters, const std::string& metrics) {
  LrTable table;
  table.frame = schedule_frame(p, train_batches_per_epoch(p));
  ScheduleFrame& frame = table.frame;
  if (iters > 0) frame.max_iters = iters;
  plugin::LrPolicyAdapter policy(*p.lr_policy.component, p.lr_policy.options,
                                 to_policy_schedule(frame));
  std::shared_ptr<kiln::Model> model = build_model_for_inspection(p);
  std::vector<double> scales;
  for (const ParamGroup& g : build_param_groups(*model, group_rules(p))) {
    table.groups.push_back(g.name);
    scales.push_back(g.lr_scale);
  }
  std::vector<io::MetricsEval> evaluations;
  if (policy.observes()) {
    if (metrics.empty()) {
      table.note = "lr_policy '" + policy.name() +
                   "' reacts to evaluations: these rates are those of a run whose evaluations "
                   "never change them (--metrics run.jsonl replays a run's)";
    } else {
      evaluations = io::read_metrics(metrics).evals;
      table.note = fmt::format("lr_policy '{}' reacts to evaluations: {} replayed from {}",
                               policy.name(), evaluations.size(), metrics);
    }
  } else if (!metrics.empty()) {
    table.note = "lr_policy '" + policy.name() + "' does not react to evaluations: " + metrics +
                 " changes nothing";
  }
  size_t next = 0;
  for (int64_t it = 1; it <= frame.max_iters; ++it) {
    // An evaluation after step it - 1 is seen before step it, as in the run.
    for (; next < evaluations.size() && evaluations[next].step < it; ++next) {
      const io::MetricsEval& e = evaluations[next];
      // A metrics file has "map" for multi-label data only.
      policy.observe(e.step, e.epoch,
                     observed_metrics(e.loss, e.accuracy, e.top5, !std::isnan(e.map), e.map));
    }
    const double lr = lr_at(frame, policy, it);
    std::vector<double> row;
    for (double s : scales) row.push_back(lr * s);
    table.lrs.push_back(std::move(row));
  }
  return table;
}

std::string format_lr_table(const LrTable& t, bool csv) {
  std::string out = csv ? "iter" : fmt::format("{:>8}", "iter");
  for (const auto& g : t.groups) out += csv ? "," + g : fmt::format("  {:>14}", g);
  out += "\n";
  for (size_t i = 0; i < t.lrs.size(); ++i) {
    out += csv ? std::to_string(i + 1) : fmt::format("{:>8}", i + 1);
    for (double lr : t.lrs[i]) out += csv ? fmt::format(",{}", lr) : fmt::format("  {:>14.8g}", lr);
    out += "\n";
  }
  return out;
}

void plot_lr_table(const LrTable& t, const std::string& png_path) {
  io::Panel panel;
  panel.title =
      fmt::format("learning rate per group ({} iterations per epoch)", t.frame.iters_per_epoch);
  panel.x_label = "iteration";
  panel.y_label = "lr";
  for (size_t g = 0; g < t.groups.size(); ++g) {
    io::Series s;
    s.label = t.groups[g];
    for (size_t i = 0; i < t.lrs.size(); ++i) {
      s.x.push_back(static_cast<double>(i + 1));
      s.y.push_back(t.lrs[i][g]);
    }
    panel.series.push_back(std::move(s));
  }
  io::write_plot(png_path, {panel});
}

}  // namespace kiln::engine
