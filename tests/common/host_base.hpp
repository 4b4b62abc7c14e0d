// The torch-free core of the tests' fake hosts: the test's definition of the host's opaque
// status, the status and log services, and built-in plugin libraries opened with dlopen.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kiln/plugin.h"

// The test is the host, so it defines the opaque status.
struct kiln_status {
  int32_t code;
  std::string message;
};

namespace kiln::test {

// Owns a status returned by a plugin.
using Status = std::unique_ptr<kiln_status>;
inline Status take(kiln_status* status) { return Status(status); }
// "" on success, else "code N: message".
std::string describe(const kiln_status* status);

// The host's make_status service.
kiln_status* make_status(int32_t code, const char* message);

// A host table with only the status and log services; the other slots are NULL, so a plugin
// that touched tensors, streams or collectives would crash the test.
kiln_host_api status_only_host();

// A plugin library opened with dlopen (never closed: its static data must outlive every use).
struct Plugin {
  const kiln_plugin_descriptor* descriptor = nullptr;
  uint32_t probe = 0;
  // The component called `name`, or nullptr.
  const kiln_component_descriptor* component(const std::string& name) const;
};
// Opens `dir`/lib`name`.so and reads its probe and descriptor; throws on failure.
Plugin open_plugin(const std::string& dir, const std::string& name);
// KILN_PLUGIN_DIR/lib`library`.so, opened once per process; throws on failure.
const Plugin& builtin(const std::string& library);
// The vtable of `component` in built-in `library`; throws when absent.
const void* component_vtable(const std::string& library, const std::string& component);

}  // namespace kiln::test
