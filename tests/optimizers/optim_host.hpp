// A minimal in-test kiln_host_api for calling optimizer vtables directly (after
// tests/plugins/fake_host): statuses that keep code and message, state tensors in a map created
// as the real host creates them (every KILN_STATE_* kind), an injectable state failure, and
// dlopen helpers.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/sdk.hpp"

// The test's own definitions of the host's opaque types.
struct kiln_status {
  int32_t code;
  std::string message;
};
struct kiln_call_context {
  std::vector<at::Tensor> params;  // the group's parameters, for *_LIKE_PARAM state
  std::vector<at::Tensor> grads;   // the group's gradients, for KILN_STATE_COPY_OF_GRAD
  std::map<std::pair<size_t, std::string>, at::Tensor> state;
  std::map<std::pair<size_t, std::string>, int32_t> state_init;  // the init kind each asked for
  // state_tensor answers KILN_ERR_OUT_OF_MEMORY for parameters from this index on.
  size_t fail_state_from = SIZE_MAX;
};

namespace kiln::test {

// The fake host's services table (process-wide, like the real one).
const kiln_host_api* optim_host();

// Owns a status returned by a plugin.
using Status = std::unique_ptr<kiln_status>;
inline Status take(kiln_status* status) { return Status(status); }
// "" on success, else "code N: message".
std::string describe(const kiln_status* status);

// A plugin library opened with dlopen (never closed: its static data must outlive every use).
struct Plugin {
  const kiln_plugin_descriptor* descriptor = nullptr;
  uint32_t probe = 0;
  // The component called `name`, or nullptr.
  const kiln_component_descriptor* component(const std::string& name) const;
};
// KILN_PLUGIN_DIR/lib`library`.so, opened once per process; throws on failure.
const Plugin& builtin(const std::string& library);
// The optimizer vtable of `component` in `library`; throws when absent.
const kiln_optimizer_vtable& optimizer_vtable(const std::string& library,
                                              const std::string& component);

// Builds a kiln_options whose values own their names.
class Options {
 public:
  Options& set_bool(const std::string& name, bool value);
  Options& set_float(const std::string& name, double value);
  // The options view; valid while this object lives and is not modified.
  const kiln_options* get();

 private:
  std::vector<std::string> names_;
  std::vector<kiln_option_value> values_;
  kiln_options options_{};
};

}  // namespace kiln::test
