#include "plugin/plugin_call.hpp"

#include <cxxabi.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <memory>
#include <new>
#include <typeinfo>

namespace kiln::plugin {
namespace {

// The demangled name of the exception in flight's type, from the C++ runtime itself, so that
// `throw 42` reads "int" rather than "unknown exception".
std::string current_exception_type() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  if (type == nullptr) return "an unknown exception";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> name(
      abi::__cxa_demangle(type->name(), nullptr, nullptr, &status), &std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(type->name());
}

}  // namespace

std::string describe_current_exception() {
  std::string type = current_exception_type();
  try {
    throw;
  } catch (const std::exception& e) {
    return type + ": " + e.what();
  } catch (...) {
    return type;
  }
}

std::string escaped_exception_text(const std::string& where) {
  return where + " threw " + describe_current_exception() +
         " (plugin entries must return a kiln_status, not throw: see KILN_GUARD in kiln/sdk.hpp)";
}

void log_escaped_exception(const std::string& text) noexcept {
  try {
    spdlog::error("{}", text);
  } catch (...) {  // logging itself failed: nothing left to tell
  }
}

}  // namespace kiln::plugin
