// A checkpoint's state.toml, read as a file from elsewhere: every field type- and range-checked,
// so what resume does with the numbers cannot overflow. Torch-free, so it is fuzzed as it is
// (tests/fuzz/checkpoint_state_fuzz.cpp); io/checkpoint.hpp reads the whole checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::io {

// A checkpoint that cannot be used; what() names the folder (or file) and the reason.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CheckpointInfo {
  int64_t step = 0;              // optimizer steps done (attempted)
  int64_t epoch = 1;             // 1-based epoch the next step belongs to
  int64_t batches_in_epoch = 0;  // batches of that epoch already consumed
  int64_t lr_counted = 0;        // steps the LR schedule has counted
  double loss_scale = 1.0;
  int64_t skipped_total = 0, skipped_in_a_row = 0;
  std::vector<double> scale_rule;              // the precision plugin's scale-rule counters
  std::vector<double> lr_state;                // the LR policy's state (ABI 1.15; often none)
  std::string config_hash;                     // of the settings that change the result
  std::map<std::string, std::string> config;   // the settings that change the result:
                                               // "section.key" -> TOML value (none in
                                               // checkpoints of older versions)
  std::map<std::string, std::string> plugins;  // slot -> "name version (library)"
};

// What state.toml records of each data file, to verify it.
struct FileRecord {
  int64_t size = 0;
  uint32_t crc32 = 0;
};

struct CheckpointState {
  CheckpointInfo info;
  std::map<std::string, FileRecord> files;  // by file name
};

// The checkpoint format state.toml's `format` names.
inline constexpr int64_t kCheckpointFormat = 1;

// The largest count state.toml may hold (steps, epochs, batches, skipped steps): 2^53, the
// largest integer every JSON reader of metrics.jsonl keeps exactly, and far from overflowing
// the arithmetic resume does with it.
inline constexpr int64_t kMaxStateCount = int64_t{1} << 53;

// Parses state.toml's `text`. Throws CheckpointError "<path>:<line>:<column>: <key> ..." for TOML
// that does not parse, a missing key, a value of the wrong type, and a number out of range:
// counts outside [0, 2^53] (epoch from 1), a loss scale not finite and > 0, scale-rule counters
// not finite, a file size < 0 or a CRC-32 outside [0, 2^32).
CheckpointState parse_checkpoint_state(std::string_view text, const std::string& path);

// Reads and parses the state.toml at `path` (at most 1 MiB: a real one is a few hundred bytes).
CheckpointState read_checkpoint_state(const std::string& path);

}  // namespace kiln::io
