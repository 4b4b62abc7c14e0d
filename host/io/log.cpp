#include "io/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <utility>

#include "io/status_line.hpp"

namespace kiln::io {
namespace {

// Forwards to the inner sink inside StatusLine::write_below; the inner sink keeps its own
// lock and formatter.
class BelowStatusLine final : public spdlog::sinks::sink {
 public:
  BelowStatusLine(std::shared_ptr<spdlog::sinks::sink> inner, StatusLine& line)
      : inner_(std::move(inner)), line_(line) {}

  void log(const spdlog::details::log_msg& msg) override {
    line_.write_below([&] { inner_->log(msg); });
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_;
  StatusLine& line_;
};

}  // namespace

std::shared_ptr<spdlog::sinks::sink> below_status_line(std::shared_ptr<spdlog::sinks::sink> inner,
                                                       StatusLine& line) {
  return std::make_shared<BelowStatusLine>(std::move(inner), line);
}

void install_console_logger(ConsoleStream stream, StatusLine* line) {
  std::shared_ptr<spdlog::sinks::sink> console;
  if (stream == ConsoleStream::kStdout) {
    console = std::make_shared<spdlog::sinks::stdout_color_sink_mt>();
  } else {
    console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  }
  const spdlog::level::level_enum level = spdlog::default_logger()->level();
  auto logger = std::make_shared<spdlog::logger>(
      "kiln", line != nullptr ? below_status_line(console, *line) : console);
  logger->set_level(level);
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
}

CliLogging::CliLogging(bool verbose, StatusLine& line) {
  install_console_logger(ConsoleStream::kStdout, &line);
  spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::info);
}

// Lines logged later (static destruction) must not reach the line, which goes with its owner.
CliLogging::~CliLogging() {
  try {
    install_console_logger(ConsoleStream::kStdout, nullptr);
  } catch (...) {
    spdlog::drop_all();  // out of memory: no logger at all rather than one with a dangling line
  }
}

}  // namespace kiln::io
