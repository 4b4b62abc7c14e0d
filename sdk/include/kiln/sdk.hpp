// kiln/sdk.hpp — C++ helpers for plugin authors (no LibTorch needed): the exception guard that
// keeps C++ exceptions from crossing the C ABI, and small conveniences over the C headers.
#ifndef KILN_SDK_HPP_
#define KILN_SDK_HPP_

#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "kiln/dataset.h"
#include "kiln/lr_policy.h"
#include "kiln/model.h"
#include "kiln/norm.h"
#include "kiln/optimizer.h"
#include "kiln/plugin.h"
#include "kiln/precision.h"

namespace kiln {

// An exception carrying a Kiln status code; KILN_GUARD turns it into a status with that code.
class Error : public std::runtime_error {
 public:
  Error(int32_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int32_t code() const noexcept { return code_; }

 private:
  int32_t code_;
};

// Runs `body` and converts any exception into a status made by `host`. Returns NULL on success.
template <typename Body>
KILN_MUST_USE kiln_status* guard(const kiln_host_api* host, Body&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const Error& e) {
    return host->make_status(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return host->make_status(KILN_ERR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return host->make_status(KILN_ERR_INTERNAL, e.what());
  } catch (...) {
    return host->make_status(KILN_ERR_INTERNAL, "unknown exception");
  }
}

// The option `name` checked to be of `type` (KILN_OPT_*); NULL when absent, so the plugin's
// default applies. A value of another type throws Error("<plugin>: option '<name>' has the
// wrong type").
inline const kiln_option_value* find_option(const kiln_options* options, const char* name,
                                            int32_t type, const char* plugin) {
  const kiln_option_value* value = kiln_options_find(options, name);
  if (value != nullptr && value->type != type) {
    throw Error(KILN_ERR_INVALID_ARGUMENT,
                std::string(plugin) + ": option '" + name + "' has the wrong type");
  }
  return value;
}

}  // namespace kiln

// Wraps a plugin function body: `return KILN_GUARD(host, { ... });`
#define KILN_GUARD(host, ...) ::kiln::guard((host), [&]() __VA_ARGS__)

#endif  // KILN_SDK_HPP_
