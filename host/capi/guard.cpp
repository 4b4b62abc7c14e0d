#include "capi/guard.hpp"

#include <fmt/format.h>

#include <new>
#include <stdexcept>

#include "config/options.hpp"
#include "engine/checks.hpp"
#include "plugin/loader.hpp"

namespace kiln::capi {
namespace {
thread_local bool t_in_callback = false;
}  // namespace

kiln_status* make_status(int32_t code, const std::string& message) noexcept {
  return plugin::make_status(code, message.c_str());
}

kiln_status* status_from_exception(int32_t fallback) noexcept {
  try {
    throw;
  } catch (const config::ConfigError& e) {
    return make_status(KILN_ERR_CONFIG, e.what());
  } catch (const engine::PipelineError& e) {
    return make_status(KILN_ERR_CONFIG, e.what());
  } catch (const plugin::LoadError& e) {
    return make_status(KILN_ERR_PLUGIN_REFUSED, e.what());
  } catch (const std::bad_alloc&) {
    return make_status(KILN_ERR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return make_status(fallback, e.what());
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
