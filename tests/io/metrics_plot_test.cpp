// kiln::io::read_metrics and plot_metrics (`kiln plot`): a metrics file as MetricsWriter writes
// it becomes a PNG of the right size with a curve in every panel; nulls, resumed runs and a line
// still being written are read sensibly; bad input is refused with the file and line.
#include "io/metrics_plot.hpp"

#include <cairo.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/metrics.hpp"
#include "io/plot.hpp"
#include "scratch.hpp"

namespace kiln::io {
namespace {

using kiln::test::Scratch;

// `steps` step records from MetricsWriter (two lr groups, loss 2.3 falling), step 7's loss
// non-finite (written as null), an evaluation after every `per_epoch` steps, the groups named
// `groups` (none: the writer names none).
void write_run(const std::string& path, int steps, int per_epoch, bool vary_scale,
               const std::vector<std::string>& groups = {}, double accuracy_per_epoch = 0.1) {
  MetricsWriter w(path);
  if (!groups.empty()) w.set_lr_groups(groups);
  for (int i = 1; i <= steps; ++i) {
    StepRecord r;
    r.step = i;
    r.epoch = (i - 1) / per_epoch + 1;
    r.loss = i == 7 ? NAN : 2.3 * std::exp(-0.05 * i) + 0.1 * std::sin(i);
    r.lr = {0.1 * (1.0 - static_cast<double>(i) / steps), 0.01};
    r.loss_scale = vary_scale ? std::ldexp(1.0, 16 - i / 10) : 1.0;
    r.grad_norm = 1.5;
    r.skipped = i == 7;
    w.write(r);
    if (i % per_epoch == 0) {
      w.write(
          EvalRecord{r.epoch, i, std::min(1.0, 0.5 + accuracy_per_epoch * r.epoch), 1.0 / r.epoch});
    }
  }
}

struct Png {
  int width = 0, height = 0;
};

// The size from the IHDR chunk, after checking the signature.
Png png_size(const Scratch& dir, const std::string& name) {
  const std::string bytes = dir.read_text(name);
  EXPECT_GE(bytes.size(), 24u);
  if (bytes.size() < 24) return {};
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(bytes.substr(12, 4), "IHDR");
  auto be32 = [&](size_t at) {
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) v = v << 8 | static_cast<unsigned char>(bytes[at + k]);
    return static_cast<int>(v);
  };
  return {be32(16), be32(20)};
}

// Pixels of a series colour (not white, black or the grey grid) in rows [top, top + rows).
int coloured_pixels(const std::string& path, int top, int rows) {
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> image(
      cairo_image_surface_create_from_png(path.c_str()), cairo_surface_destroy);
  EXPECT_EQ(cairo_surface_status(image.get()), CAIRO_STATUS_SUCCESS);
  const unsigned char* data = cairo_image_surface_get_data(image.get());
  const int stride = cairo_image_surface_get_stride(image.get());
  int count = 0;
  for (int y = top; y < top + rows; ++y) {
    const auto* row = reinterpret_cast<const uint32_t*>(data + static_cast<ptrdiff_t>(y) * stride);
    for (int x = 0; x < cairo_image_surface_get_width(image.get()); ++x) {
      const int r = (row[x] >> 16) & 0xff, g = (row[x] >> 8) & 0xff, b = row[x] & 0xff;
      if (std::max({r, g, b}) - std::min({r, g, b}) > 60) ++count;
    }
  }
  return count;
}

std::string error_of(const std::string& metrics, const std::string& png) {
  try {
    plot_metrics(metrics, png);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(MetricsPlot, PanelsForLossAccuracyAndLr) {
  Scratch dir;
  write_run(dir.path("metrics.jsonl"), 40, 20, false);
  plot_metrics(dir.path("metrics.jsonl"), dir.path("curves.png"));
  const Png png = png_size(dir, "curves.png");
  EXPECT_EQ(png.width, 900);
  EXPECT_EQ(png.height, 3 * 360);  // loss, accuracy, lr; the constant loss scale is left out
  for (int panel = 0; panel < 3; ++panel) {
    EXPECT_GT(coloured_pixels(dir.path("curves.png"), panel * 360 + 40, 270), 300)
        << "panel " << panel;
  }
}

TEST(MetricsPlot, LossScalePanelOnlyWhenItChanges) {
  Scratch dir;
  write_run(dir.path("scaled.jsonl"), 40, 20, true);
  plot_metrics(dir.path("scaled.jsonl"), dir.path("scaled.png"));
  EXPECT_EQ(png_size(dir, "scaled.png").height, 4 * 360);
  EXPECT_GT(coloured_pixels(dir.path("scaled.png"), 3 * 360 + 40, 270), 300);

  // No evaluations: no accuracy panel.
  write_run(dir.path("noeval.jsonl"), 40, 1000, false);
  plot_metrics(dir.path("noeval.jsonl"), dir.path("noeval.png"));
  EXPECT_EQ(png_size(dir, "noeval.png").height, 2 * 360);
}

TEST(MetricsPlot, ReadsNullsAndEvaluations) {
  Scratch dir;
  write_run(dir.path("metrics.jsonl"), 40, 20, false);
  const MetricsLog log = read_metrics(dir.path("metrics.jsonl"));
  ASSERT_EQ(log.steps.size(), 40u);
  ASSERT_EQ(log.evals.size(), 2u);
  EXPECT_TRUE(std::isnan(log.steps[6].loss));
  EXPECT_TRUE(log.steps[6].skipped);
  EXPECT_FALSE(log.steps[5].skipped);
  EXPECT_EQ(log.steps[5].step, 6);
  EXPECT_NEAR(log.steps[5].loss, 2.3 * std::exp(-0.3) + 0.1 * std::sin(6), 1e-12);
  ASSERT_EQ(log.steps[9].lr.size(), 2u);
  EXPECT_DOUBLE_EQ(log.steps[9].lr[0], 0.1 * (1.0 - 10.0 / 40));
  EXPECT_DOUBLE_EQ(log.steps[9].lr[1], 0.01);
  EXPECT_EQ(log.steps[39].epoch, 2);
  EXPECT_EQ(log.evals[1].epoch, 2);
  EXPECT_EQ(log.evals[1].step, 40);
  EXPECT_DOUBLE_EQ(log.evals[1].accuracy, 0.7);
  EXPECT_DOUBLE_EQ(log.evals[1].loss, 0.5);
}

TEST(MetricsPlot, ResumedRunReplacesRepeatedSteps) {
  Scratch dir;
  std::string text;
  for (int i = 1; i <= 5; ++i) {
    text += fmt::format(R"({{"type":"step","step":{},"epoch":1,"loss":1.0,"lr":[0.1]}})", i) + "\n";
  }
  text += R"({"type":"eval","epoch":1,"step":5,"accuracy":0.5,"loss":1.0})"
          "\n";
  // Resumed from the checkpoint at step 3: steps 4 and 5 and their evaluation come again.
  for (int i = 4; i <= 6; ++i) {
    text += fmt::format(R"({{"type":"step","step":{},"epoch":1,"loss":2.0,"lr":[0.1]}})", i) + "\n";
  }
  text += R"({"type":"note","text":"ignored"})"
          "\n";
  text += R"({"type":"step","step":7,"epo)";  // still being written
  dir.write_text("resumed.jsonl", text);
  const MetricsLog log = read_metrics(dir.path("resumed.jsonl"));
  ASSERT_EQ(log.steps.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(log.steps[i].step, static_cast<int64_t>(i + 1));
    EXPECT_DOUBLE_EQ(log.steps[i].loss, i < 3 ? 1.0 : 2.0) << "step " << i + 1;
  }
  EXPECT_TRUE(log.evals.empty());
}

// The lr panel's legend names the groups as `kiln lr-schedule` and TensorBoard do.
TEST(MetricsPlot, LrLegendNamesTheGroups) {
  Scratch dir;
  // A custom_keys group's name is its regular expression: quotes and backslashes survive.
  const std::vector<std::string> names = {"default", R"(custom_keys["^head\."])"};
  write_run(dir.path("named.jsonl"), 40, 20, false, names);
  const MetricsLog log = read_metrics(dir.path("named.jsonl"));
  EXPECT_EQ(log.lr_groups, names);
  const std::vector<Panel> panels = metrics_panels(log);
  ASSERT_EQ(panels.size(), 3u);
  ASSERT_EQ(panels[2].title, "Learning rate per group");
  ASSERT_EQ(panels[2].series.size(), 2u);
  EXPECT_EQ(panels[2].series[0].label, "default");
  EXPECT_EQ(panels[2].series[1].label, names[1]);

  // A file from before the names were written: numbered groups.
  write_run(dir.path("unnamed.jsonl"), 40, 20, false);
  const std::vector<Panel> old = metrics_panels(read_metrics(dir.path("unnamed.jsonl")));
  EXPECT_EQ(old[2].series[0].label, "group 0");
  EXPECT_EQ(old[2].series[1].label, "group 1");
}

TEST(MetricsPlot, AccuracyAxisStaysWithinAHundredPercentWithWholeEpochTicks) {
  Scratch dir;
  // Three epochs, every evaluation at 100%: a flat series, padded, must not pass 100%.
  write_run(dir.path("perfect.jsonl"), 30, 10, false, {}, 0.5);
  const std::vector<Panel> panels = metrics_panels(read_metrics(dir.path("perfect.jsonl")));
  ASSERT_EQ(panels[1].title, "Test accuracy per evaluation");
  const Axis y = y_axis(panels[1]);
  EXPECT_LE(y.hi, 100.0);
  EXPECT_LT(y.lo, 100.0);
  ASSERT_FALSE(y.ticks.empty());
  EXPECT_LE(y.ticks.back(), 100.0);
  // Epochs 1..3: ticks on the epochs, none between them.
  EXPECT_EQ(x_axis(panels[1]).ticks, (std::vector<double>{1.0, 2.0, 3.0}));

  // Rising accuracy over 3 epochs (60%, 70%, 80%): the axis covers the data, within [0, 100].
  write_run(dir.path("rising.jsonl"), 30, 10, false);
  const std::vector<Panel> rising = metrics_panels(read_metrics(dir.path("rising.jsonl")));
  const Axis ry = y_axis(rising[1]);
  EXPECT_LE(ry.lo, 60.0);
  EXPECT_GE(ry.hi, 80.0);
  EXPECT_LE(ry.hi, 100.0);
  EXPECT_EQ(x_axis(rising[1]).ticks, (std::vector<double>{1.0, 2.0, 3.0}));
}

TEST(MetricsPlot, RefusesBadInputWithFileAndLine) {
  Scratch dir;
  const std::string png = dir.path("out.png");
  EXPECT_NE(error_of(dir.path("absent.jsonl"), png).find(dir.path("absent.jsonl")),
            std::string::npos);

  dir.write_text("empty.jsonl", "");
  EXPECT_EQ(error_of(dir.path("empty.jsonl"), png), dir.path("empty.jsonl") + ": no step records");

  dir.write_text("evals.jsonl", R"({"type":"eval","epoch":1,"step":5,"accuracy":0.5,"loss":1})"
                                "\n");
  EXPECT_EQ(error_of(dir.path("evals.jsonl"), png), dir.path("evals.jsonl") + ": no step records");

  const std::string good = R"({"type":"step","step":1,"epoch":1,"loss":1.0,"lr":[0.1]})"
                           "\n";
  dir.write_text("bad.jsonl", good + "\n" + "{\"type\":\"step\",\"step\":3,,}\n" + good);
  EXPECT_EQ(error_of(dir.path("bad.jsonl"), png).rfind(dir.path("bad.jsonl") + ":3: bad JSON", 0),
            0u)
      << error_of(dir.path("bad.jsonl"), png);

  dir.write_text("nostep.jsonl", good + R"({"type":"step","epoch":1,"loss":1.0})"
                                        "\n");
  EXPECT_EQ(error_of(dir.path("nostep.jsonl"), png),
            dir.path("nostep.jsonl") + ":2: \"step\" must be an integer");

  dir.write_text("text.jsonl", R"({"type":"step","step":1,"loss":"low"})"
                               "\n");
  EXPECT_EQ(error_of(dir.path("text.jsonl"), png),
            dir.path("text.jsonl") + ":1: \"loss\" is not a number: low");

  dir.write_text("notype.jsonl", "{\"step\":1}\n");
  EXPECT_EQ(error_of(dir.path("notype.jsonl"), png), dir.path("notype.jsonl") + ":1: no \"type\"");

  // An unwritable PNG is named too.
  dir.write_text("ok.jsonl", good);
  const std::string nowhere = dir.path("missing-dir/out.png");
  EXPECT_NE(error_of(dir.path("ok.jsonl"), nowhere).find(nowhere), std::string::npos);
}

}  // namespace
}  // namespace kiln::io
