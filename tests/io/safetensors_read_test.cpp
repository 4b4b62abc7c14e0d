// io/safetensors: a file from elsewhere (model.init, a checkpoint) is checked before anything is
// allocated, and every bad one is a BadFileError naming the file and the tensor: a shape whose
// size overflows, ranges past the file, overlapping or with gaps, bytes after the last tensor,
// malformed header fields. Files written by Python's safetensors and by Kiln read back.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "io/untrusted.hpp"
#include "kiln_test_paths.h"
#include "scratch.hpp"
#include "shell.hpp"

namespace {

using kiln::io::BadFileError;

// An 8-byte little-endian length, the header padded with spaces to 8 bytes, then `data`.
std::string safetensors_bytes(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  return out + header + data;
}

class SafetensorsRead : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    scratch_.write_bytes(name, bytes.data(), bytes.size());
    return scratch_.path(name);
  }

  // Expects read_safetensors to throw BadFileError whose message has every one of `parts`.
  void expect_error(const std::string& header, const std::string& data,
                    const std::vector<std::string>& parts) {
    const std::string path = write("bad.safetensors", safetensors_bytes(header, data));
    try {
      kiln::io::read_safetensors(path);
      ADD_FAILURE() << "read_safetensors accepted " << header;
    } catch (const BadFileError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
      for (const auto& p : parts) {
        EXPECT_NE(message.find(p), std::string::npos) << "'" << message << "' lacks '" << p << "'";
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a BadFileError: " << e.what();
    }
  }

  kiln::test::Scratch scratch_;
};

const std::string k16Bytes(16, '\0');

}  // namespace

// The issue's file: [2^62, 4] overflowed a signed multiplication, and torch then refused the
// shape with no file named. For U8 the product wrapped to 0 bytes, matching data_offsets [0, 0].
TEST_F(SafetensorsRead, AShapeWhoseSizeOverflowsIsRefusedByName) {
  expect_error(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}})",
               k16Bytes, {"tensor 'w'", "[4611686018427387904, 4]", "overflows 64 bits"});
  expect_error(R"({"w":{"dtype":"U8","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", "",
               {"tensor 'w'", "overflows 64 bits"});
  // An empty tensor still needs strides that fit: the non-zero dimensions are bounded too.
  expect_error(
      R"({"e":{"dtype":"U8","shape":[4611686018427387904,4611686018427387904,0],"data_offsets":[0,0]}})",
      "", {"tensor 'e'", "overflows 64 bits"});
  // Dimensions at or above 2^63 do not fit int64_t at all.
  expect_error(R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})", "",
               {"tensor 'w'", "not an integer >= 0"});
}

TEST_F(SafetensorsRead, AnEmptyTensorWithAHugeDimensionReads) {
  const std::string path = write(
      "empty.safetensors",
      safetensors_bytes(
          R"({"e":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]}})", ""));
  const auto file = kiln::io::read_safetensors(path);
  ASSERT_EQ(file.tensors.size(), 1u);
  EXPECT_EQ(file.tensors[0].second.sizes(), (std::vector<int64_t>{0, int64_t{1} << 62}));
}

TEST_F(SafetensorsRead, AHeaderClaimingMoreThanTheFileHoldsIsRefused) {
  // The header's own length.
  std::string bytes = safetensors_bytes("{}", "");
  bytes[0] = static_cast<char>(0xff);
  const std::string path = write("long_header.safetensors", bytes);
  EXPECT_THROW(kiln::io::read_safetensors(path), BadFileError);
  // A tensor's range past the data.
  expect_error(R"({"w":{"dtype":"F32","shape":[1000],"data_offsets":[0,4000]}})", k16Bytes,
               {"tensor 'w'", "data_offsets [0, 4000] run past the 16 bytes", "truncated?"});
  // A range whose end precedes its start.
  expect_error(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})", k16Bytes,
               {"tensor 'w'", "end before they begin"});
  // A range that does not hold the shape's bytes.
  expect_error(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", k16Bytes,
               {"tensor 'w'", "hold 16 bytes, but shape [3] of F32 needs 12"});
}

TEST_F(SafetensorsRead, RangesThatOverlapOrLeaveGapsOrBytesOverAreRefused) {
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               std::string(12, '\0'), {"tensor 'b'", "overlap those of tensor 'a'"});
  // Two tensors sharing one range: each is the right size, together they overlap.
  expect_error(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
               R"("b":{"dtype":"I32","shape":[4],"data_offsets":[0,16]}})",
               k16Bytes, {"overlap those of tensor"});
  expect_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
               std::string(12, '\0'), {"tensor 'b'", "starts at byte 8", "end at 4"});
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", k16Bytes,
               {"describes 8 bytes of tensor data, the file holds 16"});
}

TEST_F(SafetensorsRead, MalformedFieldsAreRefusedNamingTheTensor) {
  expect_error(R"({"w":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}})", "abcd",
               {"tensor 'w'", "dtype 'F99' is not one of F32"});
  expect_error(R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,4]}})", "abcd",
               {"tensor 'w'", "shape is not a list"});
  expect_error(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd",
               {"tensor 'w'", "'-1', not an integer >= 0"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "abcd",
               {"tensor 'w'", "'1.5'"});
  // Numbers in strings are strings, as the reference reader has them: "1" is not a dimension.
  expect_error(R"({"w":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", "abcd",
               {"tensor 'w'", "shape has '\"1\"', not an integer"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":["0","4"]}})", "abcd",
               {"tensor 'w'", "data_offsets is not [begin, end]"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-1,4]}})", "abcd",
               {"tensor 'w'", "data_offsets is not [begin, end]"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", "abcd",
               {"tensor 'w'", "data_offsets is not [begin, end]"});
  expect_error(R"({"w":{"dtype":"F32","shape":[1]}})", "abcd", {"tensor 'w'", "data_offsets"});
  expect_error(R"({"w":[1,2]})", "", {"tensor 'w'", "not an object"});
  expect_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
               R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
               "ab", {"tensor 'w'", "appears twice"});
  expect_error(R"({"__metadata__":{"a":{"b":"c"}}})", "", {"__metadata__ 'a' is not a string"});
  expect_error(R"({"__metadata__":{"step":7}})", "", {"__metadata__ 'step' is not a string"});
  // Control characters in a name are escaped in the message.
  expect_error("{\"w\\u001b[2J\":{\"dtype\":\"F99\",\"shape\":[],\"data_offsets\":[0,0]}}", "",
               {"tensor 'w\\x1b[2J'"});
}

TEST_F(SafetensorsRead, HeadersThatAreNotAJsonObjectAreRefused) {
  expect_error("[]", "", {"not a JSON object"});
  expect_error("{\"w\": ", "", {"not JSON"});
  expect_error("{} trailing", "", {"not JSON"});
  // Refused while parsing, at the fourth level: deep nesting is never built.
  expect_error("{\"a\":" + std::string(100000, '['), "", {"deeper than safetensors' 3 levels"});
  const std::string path = write("short.safetensors", "abc");
  EXPECT_THROW(kiln::io::read_safetensors(path), BadFileError);
}

// Python's safetensors wrote this (tests/fuzz/corpus/safetensors/mixed_dtypes.safetensors):
// bf16, i64, an empty f16 tensor, a bool scalar, u8, and metadata.
TEST_F(SafetensorsRead, PythonsFileReads) {
  const auto file = kiln::io::read_safetensors(
      std::string(KILN_SOURCE_DIR) + "/tests/fuzz/corpus/safetensors/mixed_dtypes.safetensors");
  ASSERT_EQ(file.tensors.size(), 5u);
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(file.metadata.at("step"), "7");
  EXPECT_TRUE(at::equal(*file.find("b"), at::ones({3}, at::kLong)));
  EXPECT_EQ(file.find("a")->scalar_type(), at::kBFloat16);
  EXPECT_EQ(file.find("c")->sizes(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(file.find("d")->dim(), 0);
  EXPECT_TRUE(file.find("d")->item<bool>());
  EXPECT_TRUE(at::equal(*file.find("e"), at::ones({1, 1, 2}, at::kByte)));
}

TEST_F(SafetensorsRead, KilnsOwnFileReadsBackWithEveryDtype) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble, at::kLong, at::kInt,
                           at::kShort, at::kChar, at::kByte, at::kBool}) {
    tensors.emplace_back(std::string("t") + c10::toString(dtype),
                         at::arange(6).reshape({2, 3}).to(dtype));
  }
  tensors.emplace_back("empty", at::zeros({0, 5}));
  tensors.emplace_back("scalar", at::scalar_tensor(3.5));
  const std::string path = scratch_.path("all.safetensors");
  kiln::io::write_safetensors(path, tensors, {{"k", "v"}});
  const auto file = kiln::io::read_safetensors(path);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_NE(file.find(name), nullptr) << name;
    EXPECT_TRUE(at::equal(*file.find(name), t)) << name;
  }
  EXPECT_EQ(file.metadata.at("k"), "v");
}

// model.init is a file the user gave: a bad one is an error naming it and the tensor, exit 1.
TEST_F(SafetensorsRead, ModelInitWithTheIssuesFileIsAClearError) {
  const std::string path = write(
      "init.safetensors",
      safetensors_bytes(
          R"({"layers.0.linear.weight":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}})",
          k16Bytes));
  const std::string command =
      std::string(KILN_CLI) + " run " + KILN_SOURCE_DIR +
      "/tests/pipelines/synthetic_mlp.toml --set run.tensorboard=false" +
      " --set run.checkpoints=false --set run.output_dir=" + scratch_.path("out") +
      " --set model.init=" + path;
  const auto [code, output] = kiln::test::shell(command);
  EXPECT_EQ(code, 2) << output;  // a configuration error at model.init
  EXPECT_NE(output.find("model.init: " + path +
                        ": tensor 'layers.0.linear.weight': shape [4611686018427387904, 4]"),
            std::string::npos)
      << output;
}
