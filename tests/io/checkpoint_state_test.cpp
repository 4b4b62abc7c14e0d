// io/checkpoint_state: a checkpoint's state.toml is a file from elsewhere. Wrong types, negative
// or huge numbers and non-finite scales are CheckpointErrors naming the file, line, column and
// key; read_checkpoint refuses such a checkpoint by the same message.
#include "io/checkpoint_state.hpp"

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "scratch.hpp"

namespace {

using kiln::io::CheckpointError;
using kiln::io::parse_checkpoint_state;

// What write_checkpoint writes (keys in TOML++'s order), with `line` (e.g. "step = 3") replacing
// the line of the same key, or appended when no line has that key.
std::string state_with(const std::string& line = "") {
  std::vector<std::string> lines = {"batches_in_epoch = 4",
                                    "config_hash = 'crc32:00c0ffee'",
                                    "epoch = 2",
                                    "format = 1",
                                    "loss_scale = 1024.0",
                                    "lr_counted = 70",
                                    "scale_rule = [ 3.0, 1.0 ]",
                                    "skipped_in_a_row = 0",
                                    "skipped_total = 1",
                                    "step = 70"};
  if (!line.empty()) {
    const std::string key = line.substr(0, line.find(' '));
    bool replaced = false;
    for (auto& l : lines) {
      if (l.rfind(key + " ", 0) == 0) {
        l = line;
        replaced = true;
      }
    }
    if (!replaced) lines.insert(lines.begin(), line);
  }
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  return text +
         "\n[files.'model.safetensors']\ncrc32 = 3735928559\nsize = 1234\n"
         "\n[files.'trainer.safetensors']\ncrc32 = 0\nsize = 8\n"
         "\n[plugins]\nprecision = 'amp 1.0.0 (libkiln_amp.so)'\n";
}

// Expects parse_checkpoint_state to refuse `text` with a message holding every one of `parts`.
void expect_error(const std::string& text, const std::vector<std::string>& parts) {
  try {
    parse_checkpoint_state(text, "ck/state.toml");
    ADD_FAILURE() << "accepted:\n" << text;
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("ck/state.toml", 0), 0u) << message;
    for (const auto& p : parts) {
      EXPECT_NE(message.find(p), std::string::npos) << "'" << message << "' lacks '" << p << "'";
    }
  }
}

}  // namespace

TEST(CheckpointState, WhatTheWriterWritesParses) {
  const auto state = parse_checkpoint_state(state_with(), "ck/state.toml");
  EXPECT_EQ(state.info.step, 70);
  EXPECT_EQ(state.info.epoch, 2);
  EXPECT_EQ(state.info.batches_in_epoch, 4);
  EXPECT_EQ(state.info.lr_counted, 70);
  EXPECT_EQ(state.info.loss_scale, 1024.0);
  EXPECT_EQ(state.info.skipped_total, 1);
  EXPECT_EQ(state.info.scale_rule, (std::vector<double>{3.0, 1.0}));
  EXPECT_EQ(state.info.config_hash, "crc32:00c0ffee");
  EXPECT_EQ(state.info.plugins.at("precision"), "amp 1.0.0 (libkiln_amp.so)");
  EXPECT_EQ(state.files.at("model.safetensors").crc32, 3735928559u);
  EXPECT_EQ(state.files.at("trainer.safetensors").size, 8);
  // An integral loss scale is a number too.
  EXPECT_EQ(parse_checkpoint_state(state_with("loss_scale = 2"), "s").info.loss_scale, 2.0);
}

TEST(CheckpointState, WrongTypesAreRefusedByKeyAndPosition) {
  expect_error(
      state_with("step = \"70\""),
      {"ck/state.toml:10:8: step must be an integer in [0, 9007199254740992], not a string"});
  expect_error(state_with("epoch = 2.5"), {":3:9: epoch must be an integer", "not 2.5"});
  expect_error(state_with("loss_scale = 'big'"), {":5:14: loss_scale must be a finite number"});
  expect_error(state_with("config_hash = 7"), {"config_hash must be a string, not 7"});
  expect_error(state_with("scale_rule = [ 'x' ]"),
               {"scale_rule's counter must be a finite number"});
  expect_error(state_with("scale_rule = 3"), {"scale_rule must be an array, not 3"});
  expect_error(state_with("config_hash = []"), {"config_hash must be a string, not an array"});
  expect_error(state_with("format = 2"), {"format must be an integer in [1, 1], not 2"});
  expect_error("step = 1\n", {"ck/state.toml: format is missing"});
  std::string no_hash = state_with();
  no_hash.erase(no_hash.find("config_hash"),
                no_hash.find('\n', no_hash.find("config_hash")) - no_hash.find("config_hash") + 1);
  expect_error(no_hash, {"config_hash is missing"});
  std::string plugin_number = state_with();
  plugin_number.replace(plugin_number.find("'amp"), std::string::npos, "3\n");
  expect_error(plugin_number, {"plugins.precision must be a string"});
}

TEST(CheckpointState, NegativeHugeAndNonFiniteNumbersAreRefused) {
  expect_error(state_with("step = -1"), {"step must be an integer in [0, ", "not -1"});
  expect_error(state_with("step = 9223372036854775807"), {"not 9223372036854775807"});
  expect_error(state_with("lr_counted = 9007199254740993"), {"lr_counted", "not 9007199254740993"});
  expect_error(state_with("epoch = 0"), {"epoch must be an integer in [1, "});
  expect_error(state_with("batches_in_epoch = -5"), {"batches_in_epoch"});
  expect_error(state_with("skipped_total = -1"), {"skipped_total"});
  expect_error(state_with("skipped_in_a_row = 1e3"), {"skipped_in_a_row", "not 1000"});
  expect_error(state_with("loss_scale = inf"), {"loss_scale must be a finite number, not inf"});
  expect_error(state_with("loss_scale = nan"), {"loss_scale must be a finite number"});
  expect_error(state_with("loss_scale = 0.0"), {"loss_scale must be > 0"});
  expect_error(state_with("loss_scale = -1.0"), {"loss_scale must be > 0"});
  expect_error(state_with("scale_rule = [ 1.0, -inf ]"), {"scale_rule's counter"});
  // An integer scale beyond 2^53 would not be the same number as a double.
  expect_error(state_with("loss_scale = 9007199254740993"), {"loss_scale must be a finite number"});
  // Over TOML's own integer range: a parse error, still by position.
  expect_error(state_with("step = 99999999999999999999"), {"ck/state.toml:10:", "not TOML"});

  std::string text = state_with();
  text.replace(text.find("crc32 = 0"), 9, "crc32 = 4294967296");
  expect_error(text, {"files.trainer.safetensors.crc32 must be an integer in [0, 4294967295]"});
  text = state_with();
  text.replace(text.find("crc32 = 0"), 9, "crc32 = -1");
  expect_error(text, {"files.trainer.safetensors.crc32", "not -1"});
  text = state_with();
  text.replace(text.find("size = 8"), 8, "size = -8");
  expect_error(text, {"files.trainer.safetensors.size", "not -8"});
  text = state_with();
  text.replace(text.find("size = 8"), 8, "");
  expect_error(text, {"ck/state.toml:16:1: files.trainer.safetensors.size is missing"});
}

TEST(CheckpointState, NotTomlIsRefusedByPosition) {
  expect_error("format = 1\nstep = \n", {"ck/state.toml:2:", "not TOML"});
  expect_error(std::string("format = 1\0", 11), {"not TOML"});
}

// read_checkpoint refuses a checkpoint whose state.toml is out of range, naming the file and key,
// before it reads a tensor.
TEST(CheckpointState, ReadCheckpointRefusesABadStateByName) {
  kiln::test::Scratch scratch;
  kiln::io::CheckpointData data;
  data.info.step = 3;
  data.info.config_hash = "crc32:12345678";
  data.model.emplace_back("w", at::ones({2, 2}));
  data.trainer.emplace_back("rng/cpu", at::zeros({4}, at::kByte));
  const std::string dir = kiln::io::write_checkpoint(scratch.path("ckpt"), data, 1);
  EXPECT_EQ(kiln::io::read_checkpoint(dir).info.step, 3);

  std::ifstream in(dir + "/state.toml");
  std::stringstream text;
  text << in.rdbuf();
  std::string state = text.str();
  state.replace(state.find("step = 3"), 8, "step = 9223372036854775807");
  std::ofstream(dir + "/state.toml", std::ios::trunc) << state;
  try {
    kiln::io::read_checkpoint(dir);
    ADD_FAILURE() << "read_checkpoint accepted step 2^63 - 1";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/state.toml:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("step must be an integer"), std::string::npos) << e.what();
  }
}
