// io/error_text: LibTorch's stack traces cut out of what a user reads, the rest kept, wherever
// the c10::Error's text ended up (a plugin's status wrapped by the host).
#include "io/error_text.hpp"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>

namespace {

using kiln::io::without_backtrace;

TEST(ErrorText, ATorchCheckLosesItsTraceAndKeepsItsMessage) {
  try {
    TORCH_CHECK(false, "you tried to allocate 1900000000000 bytes");
  } catch (const c10::Error& e) {
    const std::string full = e.what();
    const std::string shown = without_backtrace("model 'mlp' could not be built: " + full);
    EXPECT_EQ(shown, "model 'mlp' could not be built: you tried to allocate 1900000000000 bytes");
    EXPECT_EQ(without_backtrace(full), e.what_without_backtrace());
  }
}

TEST(ErrorText, TextAroundATraceIsKept) {
  const std::string message =
      "first\nException raised from f at a.cpp:1 (most recent call first):\nframe #0: x\n"
      "frame #1: y\n<omitting python frames>\nframe #2: z\nafter it";
  EXPECT_EQ(without_backtrace(message), "first\nafter it");
  EXPECT_EQ(without_backtrace("no trace\nat all"), "no trace\nat all");
  EXPECT_EQ(without_backtrace(""), "");
}

}  // namespace
