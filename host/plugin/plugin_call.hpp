// Every call from the host into a plugin's code goes through `call_plugin`: an exception of any
// type that escapes the plugin (which the ABI forbids, but a C++ plugin may still let out) is
// caught at the adapter and becomes a ComponentError that names the entry and the library, so
// it ends the command the documented way instead of terminating the host.
#pragma once

#include <exception>
#include <string>

#include "kiln/abi.h"
#include "plugin/status.hpp"

namespace kiln::plugin {

// "int", "std::runtime_error: <what>", … for the exception in flight (call inside a catch).
std::string describe_current_exception();

// "<where> threw <exception>; plugin entries must return a kiln_status instead (KILN_GUARD in
// kiln/sdk.hpp)".
std::string escaped_exception_text(const std::string& where);

// Logs `text` as an error (spdlog); never throws.
void log_escaped_exception(const std::string& text) noexcept;

// Runs `call` (the raw call into the plugin) and returns its result. `where` is only invoked
// when an exception escapes, so hot paths build no text: it returns e.g.
// "optimizer 'sgd' step (/path/libkiln_sgd.so)".
template <typename Where, typename Call>
auto call_plugin(Where&& where, Call&& call) -> decltype(call()) {
  try {
    return call();
  } catch (...) {
    throw ComponentError(KILN_ERR_INTERNAL, escaped_exception_text(where()));
  }
}

// For destructors and other places that must not throw: runs `call` and logs an escaped
// exception as an error instead of propagating it.
template <typename Where, typename Call>
void call_plugin_noexcept(Where&& where, Call&& call) noexcept {
  try {
    call();
  } catch (...) {
    try {
      log_escaped_exception(escaped_exception_text(where()));
    } catch (...) {  // building the text failed (out of memory): nothing more to say
    }
  }
}

}  // namespace kiln::plugin
