#include "io/tensorboard.hpp"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <boost/filesystem/operations.hpp>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "io/crc.hpp"

namespace kiln::io {
namespace {

// TFRecord stores CRCs masked, so that a CRC of data that itself holds CRCs stays well mixed.
uint32_t masked_crc32c(const std::string& bytes) {
  const uint32_t crc = crc_of<Crc32c>(bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

// Little-endian fixed-width integers, whatever the host's byte order.
void put_fixed(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
}

// The few protobuf fields an Event with scalars needs, encoded by hand: five fields do not
// justify a protobuf dependency and a generated event.proto.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80u) {
    out.push_back(static_cast<char>((value & 0x7Fu) | 0x80u));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | type);
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_double(std::string& out, uint32_t field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed64);
  put_fixed(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed32);
  put_fixed(out, bits, 4);
}

// Event fields (tensorflow/core/util/event.proto) and those of Summary and Summary.Value.
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5,
                   kEventSessionLog = 7;
constexpr uint32_t kSessionLogStatus = 1, kSessionLogStart = 1;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;

std::string event_header(double wall_time) {
  std::string event;
  put_double(event, kEventWallTime, wall_time);
  return event;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// An Event's wall time now and its step.
std::string event_at(int64_t step) {
  std::string event = event_header(unix_now());
  if (step != 0) {  // proto3 leaves defaults out; readers take a missing step as 0
    put_key(event, kEventStep, kVarint);
    put_varint(event, static_cast<uint64_t>(step));  // int64: negatives as two's complement
  }
  return event;
}

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// Flush by size or age so a long run neither holds much in memory nor looks stalled to a
// TensorBoard watching the directory.
constexpr size_t kFlushBytes = 64 * 1024;
constexpr auto kFlushAge = std::chrono::seconds(5);

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  if (dir.empty()) throw std::runtime_error("TensorBoard log directory is empty");
  boost::system::error_code ec;
  boost::filesystem::create_directories(dir, ec);
  if (ec) {
    throw std::runtime_error(dir + ": cannot create TensorBoard log directory: " + ec.message());
  }
  const std::string base = dir + (dir.back() == '/' ? "" : "/") + "events.out.tfevents." +
                           std::to_string(static_cast<int64_t>(unix_now())) + "." + host_name() +
                           "." + std::to_string(getpid()) + ".kiln";
  // O_EXCL: never append to or truncate another writer's file.
  int fd = -1;
  for (int n = 0; fd < 0; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    const int error = errno;
    if (fd < 0 && (error != EEXIST || n == 1000)) {
      throw std::runtime_error(path_ +
                               ": cannot create TensorBoard event file: " + std::strerror(error));
    }
  }
  file_.attach(fd, path_, "TensorBoard events", kFlushAge, kFlushBytes);
  std::string event = event_header(unix_now());
  put_bytes(event, kEventFileVersion, "brain.Event:2");
  append_record(event);
  try {
    file_.flush();  // an empty run still shows up as a valid event file
  } catch (...) {
    file_.close();  // the error is thrown, not logged again on the way out
    throw;
  }
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  std::string tagged;
  put_bytes(tagged, kValueTag, tag);
  put_float(tagged, kValueSimpleValue, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, kSummaryValue, tagged);

  std::string event = event_at(step);
  put_bytes(event, kEventSummary, summary);
  append_record(event);
  file_.flush_if_due();
}

void TensorBoardWriter::session_start(int64_t step) {
  std::string session_log;
  put_key(session_log, kSessionLogStatus, kVarint);
  put_varint(session_log, kSessionLogStart);
  std::string event = event_at(step);
  put_bytes(event, kEventSessionLog, session_log);
  append_record(event);
  file_.flush_if_due();
}

void TensorBoardWriter::flush() { file_.flush(); }

// TFRecord framing: length, masked CRC of the length, data, masked CRC of the data.
void TensorBoardWriter::append_record(const std::string& event) {
  std::string record;
  put_fixed(record, event.size(), 8);
  const uint32_t length_crc = masked_crc32c(record);
  put_fixed(record, length_crc, 4);
  record += event;
  put_fixed(record, masked_crc32c(event), 4);
  file_.buffer().append(record.data(), record.data() + record.size());
}

}  // namespace kiln::io
