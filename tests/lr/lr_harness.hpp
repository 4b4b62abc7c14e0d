// A minimal host for calling the learning-rate policies through their vtables: statuses that
// keep code and message, the kiln_step library opened with dlopen, options built in the test.
// No LibTorch: lr policies are plain C and only ever make statuses.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/lr_policy.h"
#include "kiln/plugin.h"

// The test's own definition of the host's opaque status.
struct kiln_status {
  int32_t code;
  std::string message;
};

namespace kiln::lr_test {

// The fake host's services table.
const kiln_host_api* fake_host();

// Owns a status returned by a plugin; "" on success, else "code N: message".
using Status = std::unique_ptr<kiln_status>;
std::string describe(const kiln_status* status);

// The kiln_step library's descriptor (opened once from KILN_PLUGIN_DIR, never closed) and its
// probe value.
const kiln_plugin_descriptor& library();
uint32_t library_probe();
// The component called `name`; throws when there is none.
const kiln_component_descriptor& component(const std::string& name);

// Builds a kiln_options whose values own their strings and lists.
class Options {
 public:
  Options& set_bool(const std::string& name, bool value);
  Options& set_int(const std::string& name, int64_t value);
  Options& set_float(const std::string& name, double value);
  Options& set_int_list(const std::string& name, std::vector<int64_t> values);
  // Adds every option of `spec` not set yet from its default literal, as the host does.
  Options& fill_defaults(const kiln_component_descriptor& spec);
  // The options view; valid while this object lives and is not modified.
  const kiln_options* get();

 private:
  struct Entry {
    std::string name;
    kiln_option_value value;
    std::vector<int64_t> int_list;
  };
  bool has(const std::string& name) const;
  std::vector<Entry> entries_;
  std::vector<kiln_option_value> values_;
  kiln_options options_{};
};

// A frame with warm-up, as the host fills it.
kiln_lr_schedule make_schedule(double base_lr, int64_t max_iters, int64_t warmup_iters,
                               int64_t iters_per_epoch);

// One instance of a policy. create() returns the plugin's refusal (nullptr on success).
class Policy {
 public:
  explicit Policy(const std::string& component_name);
  ~Policy();
  Policy(const Policy&) = delete;
  Policy& operator=(const Policy&) = delete;

  Status create(Options& options, const kiln_lr_schedule& schedule);
  // The rate at `iter`; records a gtest failure and returns NaN when the plugin refuses.
  double at(int64_t iter) const;
  // The plugin's answer for `iter`, refusal included.
  Status try_at(int64_t iter, double* lr) const;
  void* instance() const { return instance_; }

 private:
  const kiln_lr_policy_vtable& vtable_;
  void* instance_ = nullptr;
};

}  // namespace kiln::lr_test
