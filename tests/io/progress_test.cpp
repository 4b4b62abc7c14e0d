// kiln::io::format_progress_bar: the bar's fill follows step / total_steps, the line never
// exceeds the width it is given (the bar shrinks before fields go), and the fields are there.
#include "io/progress.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace kiln::io {
namespace {

ProgressState state(int64_t step, int64_t total) {
  ProgressState s;
  s.epoch = 1;
  s.epochs = 3;
  s.step = step;
  s.total_steps = total;
  s.loss = 0.4321;
  s.lr = 0.1;
  s.samples_per_s = 3120;
  s.elapsed = 0.1 * static_cast<double>(step);  // 0.1 s a step
  return s;
}

struct Bar {
  size_t filled = 0, cells = 0;
};

Bar bar_of(const std::string& line) {
  const size_t open = line.find('['), close = line.find(']');
  EXPECT_NE(open, std::string::npos) << line;
  EXPECT_NE(close, std::string::npos) << line;
  if (open == std::string::npos || close == std::string::npos) return {};
  const std::string inside = line.substr(open + 1, close - open - 1);
  EXPECT_EQ(inside.find_first_not_of("#."), std::string::npos) << line;
  // Filled cells come first.
  EXPECT_EQ(
      inside.find('#', inside.find('.') == std::string::npos ? inside.size() : inside.find('.')),
      std::string::npos)
      << line;
  return {static_cast<size_t>(std::count(inside.begin(), inside.end(), '#')), inside.size()};
}

TEST(ProgressBar, FillFollowsTheStep) {
  const std::string empty = format_progress_bar(state(0, 1407), 120);
  EXPECT_EQ(bar_of(empty).filled, 0u) << empty;
  EXPECT_NE(empty.find("   0%"), std::string::npos) << empty;
  EXPECT_NE(empty.find("ETA ?"), std::string::npos) << empty;

  const std::string part = format_progress_bar(state(590, 1407), 120);  // 41.9%
  const Bar b = bar_of(part);
  ASSERT_GT(b.cells, 0u);
  EXPECT_EQ(b.filled, static_cast<size_t>(590.0 / 1407.0 * static_cast<double>(b.cells))) << part;
  EXPECT_NE(part.find("]  41%"), std::string::npos) << part;

  const std::string half = format_progress_bar(state(50, 100), 120);
  EXPECT_EQ(bar_of(half).filled * 2, bar_of(half).cells) << half;
  EXPECT_NE(half.find(" 50%"), std::string::npos) << half;

  const std::string full = format_progress_bar(state(1407, 1407), 120);
  EXPECT_EQ(bar_of(full).filled, bar_of(full).cells) << full;
  EXPECT_NE(full.find("100%"), std::string::npos) << full;
  EXPECT_NE(full.find("ETA 0:00"), std::string::npos) << full;

  // One step short of the end is not a full bar.
  const std::string almost = format_progress_bar(state(1406, 1407), 120);
  EXPECT_LT(bar_of(almost).filled, bar_of(almost).cells) << almost;
  EXPECT_NE(almost.find(" 99%"), std::string::npos) << almost;
}

TEST(ProgressBar, FieldsAndEta) {
  const std::string line = format_progress_bar(state(590, 1407), 200);
  EXPECT_EQ(line.rfind("epoch 1/3 [", 0), 0u) << line;
  for (const char* field : {"step 590/1407", "loss 0.4321", "lr 0.1", "3120 samples/s",
                            "ETA 1:22"}) {  // 817 steps at 0.1 s
    EXPECT_NE(line.find(field), std::string::npos) << field << " in " << line;
  }
  EXPECT_LE(line.size(), 200u);
  EXPECT_NE(format_progress_bar(state(100, 40000), 200).find("ETA 1:06:30"), std::string::npos);
}

TEST(ProgressBar, FitsTheWidth) {
  for (int width : {40, 80, 200}) {
    const std::string line = format_progress_bar(state(590, 1407), width);
    EXPECT_LE(line.size(), static_cast<size_t>(width)) << line;
    EXPECT_NE(line.find("41%"), std::string::npos) << line;
    EXPECT_NE(line.find("ETA 1:22"), std::string::npos) << line;
  }
  // At 80 columns the bar stays, at its minimum or more, and only throughput may go.
  const std::string eighty = format_progress_bar(state(590, 1407), 80);
  EXPECT_GE(bar_of(eighty).cells, 10u) << eighty;
  for (const char* field : {"epoch 1/3", "step 590/1407", "loss 0.4321", "lr 0.1"}) {
    EXPECT_NE(eighty.find(field), std::string::npos) << field << " in " << eighty;
  }
  // The bar shrinks before any field goes: one column less than the whole line at its
  // minimum bar still has everything.
  const std::string wide = format_progress_bar(state(590, 1407), 200);
  const size_t spare = bar_of(wide).cells - 10;
  const std::string snug =
      format_progress_bar(state(590, 1407), static_cast<int>(wide.size() - spare));
  EXPECT_EQ(bar_of(snug).cells, 10u) << snug;
  EXPECT_NE(snug.find("samples/s"), std::string::npos) << snug;
  EXPECT_EQ(
      format_progress_bar(state(590, 1407), static_cast<int>(snug.size()) - 1).find("samples/s"),
      std::string::npos);
  // Big numbers and every width down to nothing.
  ProgressState big = state(123456789, 987654321);
  big.loss = 12345.678;
  big.samples_per_s = 1e9;
  for (int width = 0; width <= 250; ++width) {
    EXPECT_LE(format_progress_bar(big, width).size(), static_cast<size_t>(width));
    EXPECT_LE(format_progress_bar(state(3, 7), width).size(), static_cast<size_t>(width));
  }
}

// A resumed run's clock starts at the resume: its ETA is the rate of the steps since then, not
// that time spread over every step since the run's beginning.
TEST(ProgressEta, AfterAResumeUsesTheStepsSinceTheResume) {
  ProgressState s = state(1010, 1407);
  s.first_step = 1000;
  s.elapsed = 1.0;  // 10 steps in a second since the resume
  EXPECT_DOUBLE_EQ(eta_seconds(s), 0.1 * 397);
  EXPECT_NE(format_progress(s).find("ETA 0:40"), std::string::npos) << format_progress(s);
  EXPECT_NE(format_progress_bar(s, 120).find("ETA 0:40"), std::string::npos);
  s.step = 1000;  // no step since the resume yet: no rate to go by
  EXPECT_NE(format_progress(s).find("ETA ?"), std::string::npos) << format_progress(s);
}

TEST(ProgressLine, Unchanged) {
  EXPECT_EQ(format_progress(state(200, 1407)),
            "epoch 1/3  step 200/1407  loss 0.4321  lr 0.1  3120 samples/s  ETA 2:01");
}

}  // namespace
}  // namespace kiln::io
