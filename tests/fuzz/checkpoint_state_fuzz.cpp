// libFuzzer target: arbitrary bytes as a checkpoint's state.toml through
// kiln::io::parse_checkpoint_state, what resume reads before it trusts a single number.
//
// A CheckpointError is the expected answer to a bad file. Anything else aborts, and so is a
// finding: another exception type, a sanitizer report, or an accepted state whose numbers break
// the promised ranges (counts in [0, 2^53], epoch from 1, a finite positive loss scale, finite
// scale-rule counters, file sizes >= 0).
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>

#include "fuzz_finding.hpp"
#include "io/checkpoint_state.hpp"

namespace {

[[noreturn]] void finding(const std::string& what) {
  kiln::fuzz::finding("checkpoint_state_fuzz", what);
}

void expect_count(int64_t value, int64_t lowest, const char* name) {
  if (value < lowest || value > kiln::io::kMaxStateCount) {
    finding(std::string("accepted ") + name + " = " + std::to_string(value));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kiln::io::CheckpointState state;
  try {
    state = kiln::io::parse_checkpoint_state(text, "fuzz/state.toml");
  } catch (const kiln::io::CheckpointError&) {
    return 0;  // a rejected file: the expected outcome for most inputs
  } catch (const std::exception& e) {
    finding(std::string("parse_checkpoint_state threw a non-CheckpointError exception: ") +
            e.what());
  }
  const kiln::io::CheckpointInfo& i = state.info;
  expect_count(i.step, 0, "step");
  expect_count(i.epoch, 1, "epoch");
  expect_count(i.batches_in_epoch, 0, "batches_in_epoch");
  expect_count(i.lr_counted, 0, "lr_counted");
  expect_count(i.skipped_total, 0, "skipped_total");
  expect_count(i.skipped_in_a_row, 0, "skipped_in_a_row");
  if (!std::isfinite(i.loss_scale) || !(i.loss_scale > 0.0)) finding("accepted the loss scale");
  for (const double v : i.scale_rule) {
    if (!std::isfinite(v)) finding("accepted a non-finite scale-rule counter");
  }
  for (const auto& [name, record] : state.files) {
    if (record.size < 0) finding("accepted a negative size for " + name);
  }
  return 0;
}
