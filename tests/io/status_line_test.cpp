// kiln::io::StatusLine and the console log sink: the bar is redrawn in place, and every log line,
// from whichever thread, starts on a clean line: erased bar first, no redraw in the middle.
#include "io/status_line.hpp"

#include <gtest/gtest.h>
#include <spdlog/details/log_msg.h>
#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/log.hpp"

namespace kiln::io {
namespace {

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string text;
  for (int c; (c = std::fgetc(f)) != EOF;) text += static_cast<char>(c);
  return text;
}

// Writes each message's text and a newline to the same FILE the status line draws on, as a
// console sink writes to the terminal the bar is on.
class FileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FileSink(std::FILE* out) : out_(out) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::fwrite(msg.payload.data(), 1, msg.payload.size(), out_);
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  void flush_() override { std::fflush(out_); }

 private:
  std::FILE* out_;
};

constexpr const char* kErase = "\r\033[K";

TEST(StatusLine, DrawsAndErasesInPlace) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  StatusLine line(out);
  EXPECT_FALSE(line.shown());
  line.clear();  // nothing shown: nothing written
  line.draw("epoch 1/3 [####......]  41%");
  EXPECT_TRUE(line.shown());
  line.draw("epoch 1/3 [#####.....]  50%");
  line.clear();
  EXPECT_FALSE(line.shown());
  line.clear();
  EXPECT_EQ(contents(out),
            "\repoch 1/3 [####......]  41%\033[K\repoch 1/3 [#####.....]  50%\033[K" +
                std::string(kErase));
  std::fclose(out);
  EXPECT_GT(terminal_width(), 0);
}

TEST(StatusLine, ALogLineErasesTheBarFirst) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  StatusLine line(out);
  spdlog::logger logger("test", below_status_line(std::make_shared<FileSink>(out), line));
  logger.info("before any bar");
  line.draw("bar 41%");
  logger.info("checkpoint out/ckpt-500");
  EXPECT_FALSE(line.shown());  // the caller redraws at its next step
  logger.warn("a second line: nothing to erase");
  line.draw("bar 42%");
  EXPECT_EQ(contents(out), "before any bar\n\rbar 41%\033[K" + std::string(kErase) +
                               "checkpoint out/ckpt-500\na second line: nothing to erase\n"
                               "\rbar 42%\033[K");
  std::fclose(out);
}

// Log lines from other threads (a data worker, a plugin, a DDP watchdog) while the training
// thread redraws the bar: every line is whole and starts after a newline or an erased bar.
TEST(StatusLine, LinesFromOtherThreadsNeverFollowTheBar) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  StatusLine line(out);
  spdlog::logger logger("test", below_status_line(std::make_shared<FileSink>(out), line));
  constexpr int kThreads = 3, kLines = 300, kDraws = 3000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&logger, t] {
      for (int i = 0; i < kLines; ++i) logger.info("thread {} line {}", t, i);
    });
  }
  for (int i = 0; i < kDraws; ++i) line.draw("bar " + std::to_string(i) + "%");
  for (std::thread& t : threads) t.join();
  const std::string text = contents(out);
  std::fclose(out);

  int lines = 0;
  for (size_t at = text.find("thread "); at != std::string::npos;
       at = text.find("thread ", at + 1)) {
    ++lines;
    const bool after_newline = at == 0 || text[at - 1] == '\n';
    const bool after_erase = at >= 4 && text.compare(at - 4, 4, kErase) == 0;
    ASSERT_TRUE(after_newline || after_erase)
        << "line " << lines << " follows \"" << text.substr(at >= 12 ? at - 12 : 0, 12) << "\"";
    const size_t end = text.find('\n', at);
    ASSERT_NE(end, std::string::npos);
    EXPECT_EQ(text.substr(at, end - at).find('\r'), std::string::npos) << "a draw inside a line";
  }
  EXPECT_EQ(lines, kThreads * kLines);
}

}  // namespace
}  // namespace kiln::io
