// Calling the learning-rate policies through their vtables: the common torch-free host (status
// and log services only), the kiln_lr_schedules library opened with dlopen, options built in the
// test. No LibTorch: lr policies are plain C and only ever make statuses.
#pragma once

#include <cstdint>
#include <string>

#include "host_base.hpp"
#include "kiln/lr_policy.h"
#include "options.hpp"

namespace kiln::lr_test {

using kiln::test::describe;
using kiln::test::Options;
using kiln::test::Status;

// The fake host's services table.
const kiln_host_api* fake_host();

// The kiln_lr_schedules library's descriptor (opened once from KILN_PLUGIN_DIR, never closed) and
// its probe value.
const kiln_plugin_descriptor& library();
uint32_t library_probe();
// The component called `name`; throws when there is none.
const kiln_component_descriptor& component(const std::string& name);

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
