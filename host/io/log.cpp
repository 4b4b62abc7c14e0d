#include "io/log.hpp"

#include <spdlog/spdlog.h>

namespace kiln::io {

void setup_logging(bool verbose) {
  spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
  spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::info);
}

}  // namespace kiln::io
