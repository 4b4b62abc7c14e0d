// The host side of kiln_status: the object behind the opaque pointer, and helpers that turn a
// returned status into a C++ exception at the adapter boundary.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "kiln/abi.h"

struct kiln_status {
  // Where a configuration error points (the C API's status_location); located is false when
  // the status carries no position.
  struct Location {
    bool located = false;
    std::string file, key;
    int64_t line = 0, column = 0;
  };
  int32_t code;
  std::string message;
  Location location;
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

// A component refused the options it was created with: a configuration error. `section` is
// the pipeline table the component's options come from (its kind: "optimizer", "norm", …) and
// `reason` the component's own words, which name the option at fault.
class OptionsRefused : public ComponentError {
 public:
  OptionsRefused(int32_t code, const std::string& what, std::string section, std::string reason)
      : ComponentError(code, what), section_(std::move(section)), reason_(std::move(reason)) {}
  const std::string& section() const noexcept { return section_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string section_;
  std::string reason_;
};

// The one implementation of the kiln_status object, behind the host services (make_status,
// free_status) and the C API's status functions: a new status (a message that cannot be
// stored gives an empty OUT_OF_MEMORY status), its code and message (KILN_OK and "" for NULL),
// and its release.
kiln_status* make_status(int32_t code, const char* message) noexcept;
int32_t status_code(const kiln_status* status) noexcept;
const char* status_message(const kiln_status* status) noexcept;
void free_status(kiln_status* status) noexcept;

// Frees `status` and returns its message (empty for NULL).
std::string take_message(kiln_status* status);

// Throws ComponentError("<context>: <message>") when `status` is non-NULL; frees it either way.
void check(kiln_status* status, const std::string& context);

// The same for a `create` call: throws OptionsRefused, its section `section`.
void check_options(kiln_status* status, const std::string& context, const char* section);

}  // namespace kiln::plugin
