// io/metrics: MetricsWriter buffers step lines and writes only whole ones; flush(), an
// evaluation, a full buffer and the destructor put them in the file; appending to a file a
// killed run left half-written drops the partial line; a file that cannot be opened is named.
#include "io/metrics.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "scratch.hpp"

namespace kiln::io {
namespace {

using kiln::test::Scratch;
using Clock = std::chrono::steady_clock;

StepRecord record(int64_t step) {
  StepRecord r;
  r.step = step;
  r.epoch = 1;
  r.loss = 2.0;
  r.lr = {0.1, 0.2};
  r.grad_norm = NAN;
  r.memory_mb = NAN;
  return r;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string step_line(int64_t step) {
  return R"({"type":"step","step":)" + std::to_string(step) +
         R"(,"epoch":1,"loss":2,"lr":[0.1,0.2],"started":0,"step_time":0,"data_time":0,)"
         R"("samples_per_s":0,"loss_scale":1,"grad_norm":null,"skipped":false,)"
         R"("skipped_total":0,"micro_batches":1,"memory_mb":null,"tensor_mb":0,)"
         R"("tensor_peak_mb":0,"activation_mb":0,"allreduces":0})";
}

TEST(MetricsWriter, StepLinesWaitForAFlushAndTheDestructor) {
  Scratch dir;
  const std::string path = dir.path("m.jsonl");
  {
    const auto start = Clock::now();
    MetricsWriter w(path);
    w.write(record(1));
    w.write(record(2));
    // Unless this thread stalled past the writer's one-second bound, nothing was written yet.
    if (Clock::now() - start < std::chrono::milliseconds(500)) {
      EXPECT_EQ(dir.read_text("m.jsonl"), "");
    }
    w.flush();
    EXPECT_EQ(lines(dir.read_text("m.jsonl")),
              (std::vector<std::string>{step_line(1), step_line(2)}));
    w.write(record(3));
  }
  EXPECT_EQ(lines(dir.read_text("m.jsonl")),
            (std::vector<std::string>{step_line(1), step_line(2), step_line(3)}));
}

TEST(MetricsWriter, AnEvaluationIsWrittenThroughWithTheLinesBeforeIt) {
  Scratch dir;
  const std::string path = dir.path("m.jsonl");
  MetricsWriter w(path);
  w.write(record(1));
  w.write(EvalRecord{1, 1, 0.5, 1.25, 0.75});
  EXPECT_EQ(lines(dir.read_text("m.jsonl")),
            (std::vector<std::string>{
                step_line(1),
                R"({"type":"eval","epoch":1,"step":1,"accuracy":0.5,"loss":1.25,"top5":0.75})"}));
}

// A multi-label evaluation: null accuracies and its mean average precision, null too when it
// could not be computed (NaN logits, no class with a positive sample).
TEST(MetricsWriter, AMultiLabelEvaluationCarriesItsMap) {
  Scratch dir;
  MetricsWriter w(dir.path("m.jsonl"));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  w.write(EvalRecord{2, 8, nan, 0.5, nan, 0.625, true});
  w.write(EvalRecord{3, 9, nan, 0.5, nan, nan, true});
  EXPECT_EQ(
      lines(dir.read_text("m.jsonl")),
      (std::vector<std::string>{
          R"({"type":"eval","epoch":2,"step":8,"accuracy":null,"loss":0.5,"top5":null,"map":0.625})",
          R"({"type":"eval","epoch":3,"step":9,"accuracy":null,"loss":0.5,"top5":null,"map":null})"}));
}

TEST(MetricsWriter, AFullBufferIsWrittenWithoutAFlush) {
  Scratch dir;
  const std::string path = dir.path("m.jsonl");
  MetricsWriter w(path);
  // About 390 bytes a line: 400 lines pass the 64 KiB bound at least twice.
  for (int64_t s = 1; s <= 400; ++s) w.write(record(s));
  const std::vector<std::string> written = lines(dir.read_text("m.jsonl"));
  ASSERT_GE(written.size(), 150u);
  ASSERT_LT(written.size(), 400u + 1);
  // Whole lines only, in order.
  for (size_t i = 0; i < written.size(); ++i) EXPECT_EQ(written[i], step_line(i + 1));
  EXPECT_EQ(dir.read_text("m.jsonl").back(), '\n');
}

TEST(MetricsWriter, AppendingDropsAPartialLastLine) {
  Scratch dir;
  const std::string path = dir.path("m.jsonl");
  dir.write_text("m.jsonl", step_line(1) + "\n" + step_line(2).substr(0, 40));
  {
    MetricsWriter w(path, /*append=*/true);
    w.write(record(2));
  }
  EXPECT_EQ(lines(dir.read_text("m.jsonl")),
            (std::vector<std::string>{step_line(1), step_line(2)}));

  // No newline at all: nothing of the file is a record.
  dir.write_text("n.jsonl", step_line(1).substr(0, 10));
  { MetricsWriter(dir.path("n.jsonl"), /*append=*/true).write(record(1)); }
  EXPECT_EQ(dir.read_text("n.jsonl"), step_line(1) + "\n");

  // Whole lines stay as they are; a fresh file starts empty.
  {
    MetricsWriter w(path, /*append=*/true);
    w.write(record(3));
  }
  EXPECT_EQ(lines(dir.read_text("m.jsonl")),
            (std::vector<std::string>{step_line(1), step_line(2), step_line(3)}));
  { MetricsWriter(path, /*append=*/false).write(record(9)); }
  EXPECT_EQ(lines(dir.read_text("m.jsonl")), (std::vector<std::string>{step_line(9)}));
}

TEST(MetricsWriter, AFileThatCannotBeOpenedIsNamed) {
  Scratch dir;
  const std::string path = dir.path("no/such/folder/m.jsonl");
  try {
    MetricsWriter w(path);
    FAIL() << "opened " << path;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": cannot open metrics file"), std::string::npos)
        << e.what();
  }
  MetricsWriter off("");  // an empty path writes nothing
  EXPECT_FALSE(off.enabled());
  off.write(record(1));
  off.flush();
}

}  // namespace
}  // namespace kiln::io
