// The host side of kiln_status: the object behind the opaque pointer, and helpers that turn a
// returned status into a C++ exception at the adapter boundary.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kiln/abi.h"

struct kiln_status {
  int32_t code;
  std::string message;
};

namespace kiln::plugin {

// A component reported an error; what() is "<context>: <message>".
class ComponentError : public std::runtime_error {
 public:
  ComponentError(int32_t code, const std::string& what) : std::runtime_error(what), code_(code) {}
  int32_t code() const noexcept { return code_; }

 private:
  int32_t code_;
};

// Frees `status` and returns its message (empty for NULL).
std::string take_message(kiln_status* status);

// Throws ComponentError("<context>: <message>") when `status` is non-NULL; frees it either way.
void check(kiln_status* status, const std::string& context);

}  // namespace kiln::plugin
