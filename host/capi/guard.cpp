#include "capi/guard.hpp"

#include <fmt/format.h>

#include <cstring>
#include <new>
#include <stdexcept>

#include "config/options.hpp"
#include "data/source.hpp"
#include "engine/checks.hpp"
#include "io/error_text.hpp"
#include "plugin/loader.hpp"

namespace kiln::capi {
namespace {
thread_local bool t_in_callback = false;

// Gives a configuration error's status the position it points at (status_location).
void locate(kiln_status* s, const std::string& file, const std::string& key, int64_t line,
            int64_t column) noexcept {
  if (s == nullptr) return;
  try {
    s->location = kiln_status::Location{true, file, key, line, column};
  } catch (...) {
    s->location = kiln_status::Location{};  // out of memory: the message still says it
  }
}
}  // namespace

kiln_status* make_status(int32_t code, const std::string& message) noexcept {
  return plugin::make_status(code, message.c_str());
}

kiln_status* status_from_exception(int32_t fallback) noexcept {
  try {
    throw;
  } catch (const config::ConfigError& e) {
    kiln_status* s = make_status(KILN_ERR_CONFIG, io::without_backtrace(e.what()));
    if (e.located()) locate(s, e.pos().file, e.key(), e.pos().line, e.pos().column);
    return s;
  } catch (const engine::PipelineError& e) {
    kiln_status* s = make_status(KILN_ERR_CONFIG, e.what());
    locate(s, "", e.key(), 0, 0);
    return s;
  } catch (const plugin::LoadError& e) {
    return make_status(KILN_ERR_PLUGIN_REFUSED, e.what());
  } catch (const data::BrokenSource& e) {
    // A dataset plugin that broke its contract: refused, as by `kiln` (exit 3).
    return make_status(KILN_ERR_PLUGIN_REFUSED, "plugin refused: " + std::string(e.what()));
  } catch (const std::bad_alloc&) {
    return make_status(KILN_ERR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    // No C++ stack trace in a caller's message (c10::Error carries one in what()).
    return make_status(fallback, io::without_backtrace(e.what()));
  } catch (...) {
    return make_status(KILN_ERR_INTERNAL, "an exception that is not a std::exception");
  }
}

std::mutex& training_lock() {
  static std::mutex lock;
  return lock;
}

bool in_callback() { return t_in_callback; }
void set_in_callback(bool inside) { t_in_callback = inside; }

int32_t status_location(const kiln_status* status, kiln_status_location* out) noexcept {
  if (out == nullptr || out->struct_size < KILN_STATUS_LOCATION_V1_SIZE) return 0;
  kiln_status_location l{};
  l.file = l.key = "";
  const bool located = status != nullptr && status->location.located;
  if (located) {
    l.file = status->location.file.c_str();
    l.key = status->location.key.c_str();
    l.line = status->location.line;
    l.column = status->location.column;
  }
  const size_t size = out->struct_size < sizeof(l) ? out->struct_size : sizeof(l);
  std::memcpy(reinterpret_cast<char*>(out) + sizeof(size_t),
              reinterpret_cast<const char*>(&l) + sizeof(size_t), size - sizeof(size_t));
  return located ? 1 : 0;
}

kiln_status* check_size(size_t size, size_t v1_size, const char* what) noexcept {
  if (size >= v1_size) return nullptr;
  try {
    return make_status(KILN_ERR_INVALID_ARGUMENT,
                       fmt::format("{}.struct_size is {}, below the version-1 size {} (set it to "
                                   "sizeof({}))",
                                   what, size, v1_size, what));
  } catch (...) {
    return make_status(KILN_ERR_INVALID_ARGUMENT, what);
  }
}

}  // namespace kiln::capi
