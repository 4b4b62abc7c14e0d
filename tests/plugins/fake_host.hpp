// A minimal in-test kiln_host_api for calling plugin vtables directly: statuses that keep code
// and message, state tensors in a map, a single-process "process group", and dlopen helpers.
#pragma once

#include <ATen/core/Tensor.h>

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
  std::map<std::pair<size_t, std::string>, at::Tensor> state;
};

namespace kiln::test {

// The fake host's services table (process-wide, like the real one).
const kiln_host_api* fake_host();

// Owns a status returned by a plugin.
using Status = std::unique_ptr<kiln_status>;
inline Status take(kiln_status* status) { return Status(status); }
// "" on success, else "code N: message".
std::string describe(kiln_status* status);

// A plugin library opened with dlopen (never closed: its static data must outlive every use).
struct Plugin {
  const kiln_plugin_descriptor* descriptor = nullptr;
  uint32_t probe = 0;
  // The component called `name`, or nullptr.
  const kiln_component_descriptor* component(const std::string& name) const;
};
// Opens `dir`/lib`name`.so and reads its probe and descriptor; throws on failure.
Plugin open_plugin(const std::string& dir, const std::string& name);

// Builds a kiln_options whose values own their strings and lists.
class Options {
 public:
  Options& set_bool(const std::string& name, bool value);
  Options& set_float(const std::string& name, double value);
  Options& set_int_list(const std::string& name, std::vector<int64_t> values);
  // The options view; valid while this object lives and is not modified.
  const kiln_options* get();

 private:
  std::vector<std::string> names_;
  std::vector<kiln_option_value> values_;
  std::vector<std::vector<int64_t>> int_lists_;
  kiln_options options_{};
};

}  // namespace kiln::test
