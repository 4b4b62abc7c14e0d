// kiln::io::TensorBoardWriter against TensorBoard's own reader (tests/oracle/tensorboard_read.py):
// every scalar comes back with its tag, step and float32 value, every record passes the reader's
// CRC checks and re-serializes to the same bytes; refusals name the path.
#include "io/tensorboard.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <boost/filesystem/operations.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/crc.hpp"
#include "scratch.hpp"

namespace kiln::io {
namespace {

using kiln::test::Scratch;

struct Scalar {
  std::string tag;
  int64_t step;
  double value;
};

// One line of events.tsv.
struct Record {
  std::string file;
  double wall_time;
  int64_t step;
  std::string file_version;  // "-" for a summary record
  std::string tag;           // "-" for the file_version record
  std::string bits;
  bool canonical;
};

std::vector<std::vector<std::string>> read_tsv(const Scratch& scratch, const std::string& name) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream lines(scratch.read_text(name));
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> fields;
    std::istringstream cells(line);
    for (std::string cell; std::getline(cells, cell, '\t');) fields.push_back(cell);
    rows.push_back(fields);
  }
  return rows;
}

std::vector<Record> read_records(const Scratch& scratch) {
  std::vector<Record> records;
  for (const auto& f : read_tsv(scratch, "events.tsv")) {
    EXPECT_EQ(f.size(), 7u);
    if (f.size() != 7u) continue;
    records.push_back({f[0], std::stod(f[1]), std::stoll(f[2]), f[3], f[4], f[5], f[6] == "1"});
  }
  return records;
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string basename(const std::string& path) { return path.substr(path.rfind('/') + 1); }

uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// The value TensorBoard must serve for `written`: float32-rounded, NaN as any NaN.
void expect_value(const std::string& bits_text, double written, const std::string& where) {
  const uint32_t bits = static_cast<uint32_t>(std::stoul(bits_text));
  float read;
  std::memcpy(&read, &bits, sizeof read);
  if (std::isnan(written)) {
    EXPECT_TRUE(std::isnan(read)) << where;
  } else {
    EXPECT_EQ(bits, float_bits(static_cast<float>(written)))
        << where << ": wrote " << written << ", read " << read;
  }
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A training run's scalars in the order the trainer writes them: steps ascending (TensorBoard
// drops data behind a step that goes back), values across float32's range.
std::vector<Scalar> training_scalars() {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> specials = {0.0,   -0.0,  1.0 / 3.0, -2.5,         1e30, -3.4e38,
                                        1e-30, 1e-40, 1e-45,     inf,          -inf, nan,
                                        65504, 0.1,   -1e-7,     123456789.123};
  std::vector<Scalar> scalars = {{"lr/group0", 0, 0.0}};  // step 0: the field is left out
  for (int64_t step = 1; step <= 40; ++step) {
    const double x = static_cast<double>(step);
    scalars.push_back({"loss", step, 2.5 / x - 0.01 * x});
    scalars.push_back({"lr/group0", step, 1e-3 * x / 40.0});
    scalars.push_back({"lr/group1", step, -1e-5 * x});
    scalars.push_back({"loss_scale", step, std::ldexp(1.0, static_cast<int>(step % 24))});
    scalars.push_back({"grad_norm", step, specials[static_cast<size_t>(step) % specials.size()]});
    if (step % 10 == 0) scalars.push_back({"eval/accuracy", step, 0.5 + x / 100.0});
  }
  // Multi-byte varints: steps past 2^7, 2^14, 2^31; a tag whose lengths need two bytes.
  for (int64_t step : {127LL, 128LL, 16384LL, 2147483648LL, 1099511627776LL}) {
    scalars.push_back({"big_step", step, static_cast<double>(step)});
    scalars.push_back({"long/" + std::string(200, 'x'), step, -static_cast<double>(step)});
  }
  return scalars;
}

TEST(TensorBoardWriter, ScalarsReadBackByTensorBoard) {
  Scratch scratch;
  const std::vector<Scalar> scalars = training_scalars();
  const double before = unix_now();
  std::string path;
  {
    TensorBoardWriter writer(scratch.path(""));
    path = writer.path();
    for (const Scalar& s : scalars) writer.scalar(s.tag, s.value, s.step);
  }
  const double after = unix_now();
  ASSERT_EQ(path.rfind(scratch.path("events.out.tfevents."), 0), 0u) << path;
  ASSERT_NE(path.find(".kiln"), std::string::npos) << path;

  scratch.run("tensorboard_read.py");
  ASSERT_FALSE(exists(scratch.path("error.txt"))) << scratch.read_text("error.txt");

  // Record by record: the file_version event, then one event per scalar in write order.
  const std::vector<Record> records = read_records(scratch);
  ASSERT_EQ(records.size(), scalars.size() + 1);
  EXPECT_EQ(records[0].file_version, "brain.Event:2");
  EXPECT_EQ(records[0].step, 0);
  double last_wall_time = before;
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    const std::string where = "record " + std::to_string(i);
    EXPECT_EQ(r.file, basename(path)) << where;
    EXPECT_TRUE(r.canonical) << where << ": not protobuf's own encoding";
    EXPECT_GE(r.wall_time, last_wall_time - 1e-3) << where;
    EXPECT_LE(r.wall_time, after + 1e-3) << where;
    last_wall_time = r.wall_time;
    if (i == 0) continue;
    const Scalar& s = scalars[i - 1];
    EXPECT_EQ(r.file_version, "-") << where;
    EXPECT_EQ(r.tag, s.tag) << where;
    EXPECT_EQ(r.step, s.step) << where;
    expect_value(r.bits, s.value, where + " (" + s.tag + ")");
  }

  // What TensorBoard serves: per tag (sorted), steps in order, nothing dropped.
  std::vector<Scalar> expected = scalars;
  std::stable_sort(expected.begin(), expected.end(),
                   [](const Scalar& a, const Scalar& b) { return a.tag < b.tag; });
  const auto served = read_tsv(scratch, "scalars.tsv");
  ASSERT_EQ(served.size(), expected.size());
  for (size_t i = 0; i < served.size(); ++i) {
    ASSERT_EQ(served[i].size(), 3u);
    const std::string where = "served scalar " + std::to_string(i);
    EXPECT_EQ(served[i][0], expected[i].tag) << where;
    EXPECT_EQ(std::stoll(served[i][1]), expected[i].step) << where;
    expect_value(served[i][2], expected[i].value, where + " (" + expected[i].tag + ")");
  }
}

TEST(TensorBoardWriter, FlushMakesScalarsVisibleWhileOpen) {
  Scratch scratch;
  TensorBoardWriter writer(scratch.path(""));
  writer.scalar("loss", 1.5, 1);
  writer.flush();
  scratch.run("tensorboard_read.py");
  auto served = read_tsv(scratch, "scalars.tsv");
  ASSERT_EQ(served.size(), 1u);
  EXPECT_EQ(served[0][0], "loss");
  expect_value(served[0][2], 1.5, "step 1");

  writer.scalar("loss", 0.75, 2);
  writer.flush();
  scratch.run("tensorboard_read.py");
  served = read_tsv(scratch, "scalars.tsv");
  ASSERT_EQ(served.size(), 2u);
  EXPECT_EQ(served[1][1], "2");
  expect_value(served[1][2], 0.75, "step 2");
}

// A resumed run's file starts with SessionLog START at the step after its checkpoint: what the
// interrupted run's file holds from that step on (logged after its checkpoint, then lost to a
// kill) is dropped, and every step is served once, with the resumed run's values.
TEST(TensorBoardWriter, SessionStartDropsTheStepsAnInterruptedRunLoggedAfterItsCheckpoint) {
  Scratch scratch;
  {
    TensorBoardWriter interrupted(scratch.path(""));
    for (int64_t step = 1; step <= 10; ++step) interrupted.scalar("loss", 1.0 * step, step);
  }
  {
    TensorBoardWriter resumed(scratch.path(""));  // a later second or ".kiln.1": read after
    resumed.session_start(6);
    for (int64_t step = 6; step <= 8; ++step) resumed.scalar("loss", 100.0 + step, step);
  }
  scratch.run("tensorboard_read.py");
  ASSERT_FALSE(exists(scratch.path("error.txt"))) << scratch.read_text("error.txt");
  const auto served = read_tsv(scratch, "scalars.tsv");
  ASSERT_EQ(served.size(), 8u);
  for (size_t i = 0; i < served.size(); ++i) {
    const int64_t step = static_cast<int64_t>(i) + 1;
    EXPECT_EQ(std::stoll(served[i][1]), step);
    expect_value(served[i][2], step < 6 ? 1.0 * step : 100.0 + step, "step " + served[i][1]);
  }
}

// The oracle is not lenient: a flipped byte fails the reader's CRC check.
TEST(TensorBoardWriter, CorruptRecordFailsTheCrcCheck) {
  Scratch scratch;
  std::string path;
  {
    TensorBoardWriter writer(scratch.path(""));
    path = writer.path();
    writer.scalar("loss", 1.0, 1);
  }
  const std::string name = basename(path);
  std::string bytes = scratch.read_text(name);
  ASSERT_GT(bytes.size(), 20u);
  bytes[bytes.size() - 10] ^= 0x01;  // inside the last record's data
  scratch.write_bytes(name, bytes.data(), bytes.size());
  scratch.run("tensorboard_read.py");
  ASSERT_TRUE(exists(scratch.path("error.txt")));
  EXPECT_NE(scratch.read_text("error.txt").find("crc"), std::string::npos)
      << scratch.read_text("error.txt");
}

TEST(TensorBoardWriter, EmptyRunIsAValidEventFile) {
  Scratch scratch;
  { TensorBoardWriter writer(scratch.path("")); }
  scratch.run("tensorboard_read.py");
  const std::vector<Record> records = read_records(scratch);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].file_version, "brain.Event:2");
  EXPECT_TRUE(read_tsv(scratch, "scalars.tsv").empty());
}

TEST(TensorBoardWriter, CreatesParentDirectories) {
  Scratch scratch;
  // Scratch removes only its own flat files; this removes the tree even when an assertion fails.
  struct RemoveTree {
    std::string root;
    ~RemoveTree() { boost::filesystem::remove_all(root); }
  } remove_runs{scratch.path("runs")};
  const std::string logdir = scratch.path("runs/a/tb");
  std::string path;
  {
    TensorBoardWriter writer(logdir);
    path = writer.path();
    writer.scalar("loss", 2.0, 3);
  }
  EXPECT_EQ(path.rfind(logdir + "/events.out.tfevents.", 0), 0u) << path;
  scratch.write_text("config.json", "{\"logdir\": \"" + logdir + "\"}");
  scratch.run("tensorboard_read.py");
  const auto served = read_tsv(scratch, "scalars.tsv");
  ASSERT_EQ(served.size(), 1u);
  EXPECT_EQ(served[0][1], "3");
}

TEST(TensorBoardWriter, TwoWritersInOneDirectoryWriteDistinctFiles) {
  Scratch scratch;
  TensorBoardWriter first(scratch.path(""));
  TensorBoardWriter second(scratch.path(""));
  ASSERT_NE(first.path(), second.path());
  first.scalar("first", 1.0, 1);
  second.scalar("second", 2.0, 1);
  first.flush();
  second.flush();
  scratch.run("tensorboard_read.py");
  const std::vector<Record> records = read_records(scratch);
  ASSERT_EQ(records.size(), 4u);
  for (const Record& r : records) {
    if (r.tag == "-") continue;
    EXPECT_EQ(r.file, basename(r.tag == "first" ? first.path() : second.path())) << r.tag;
  }
}

void expect_refusal(const std::string& dir, const std::string& what) {
  try {
    TensorBoardWriter writer(dir);
    ADD_FAILURE() << what << ": no exception for " << dir;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << what << ": " << e.what();
  }
}

TEST(TensorBoardWriter, RefusalsNameThePath) {
  expect_refusal("/proc/kiln", "unwritable parent");
  expect_refusal("/proc/kiln/nested/tb", "unwritable parent, nested");
  Scratch scratch;
  scratch.write_text("plain", "not a directory");
  expect_refusal(scratch.path("plain"), "a regular file");
  expect_refusal(scratch.path("plain/tb"), "below a regular file");
  EXPECT_THROW(TensorBoardWriter(""), std::runtime_error);
}

// io/crc.hpp's two CRCs (Boost.CRC) against the check values of their catalogue entries.
TEST(Crc, CheckValuesOfTheStandardTestVector) {
  const char nine[] = "123456789";
  EXPECT_EQ(crc_of<Crc32c>(nine, 9), 0xE3069283u);  // CRC-32C (iSCSI), TFRecord framing
  EXPECT_EQ(crc_of<Crc32>(nine, 9), 0xCBF43926u);   // CRC-32 (zlib), checkpoint manifests
  EXPECT_EQ(crc_of<Crc32c>(nine, 0), 0u);
}

}  // namespace
}  // namespace kiln::io
