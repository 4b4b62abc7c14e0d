#include "lr_harness.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

namespace kiln::lr_test {

const kiln_host_api* fake_host() {
  static const kiln_host_api api = kiln::test::status_only_host();
  return &api;
}

const kiln_plugin_descriptor& library() {
  return *kiln::test::builtin("kiln_lr_schedules").descriptor;
}
uint32_t library_probe() { return kiln::test::builtin("kiln_lr_schedules").probe; }

const kiln_component_descriptor& component(const std::string& name) {
  const kiln_component_descriptor* c = kiln::test::builtin("kiln_lr_schedules").component(name);
  if (c == nullptr) throw std::runtime_error("kiln_lr_schedules has no component " + name);
  return *c;
}

kiln_lr_schedule make_schedule(double base_lr, int64_t max_iters, int64_t warmup_iters,
                               int64_t iters_per_epoch) {
  return {sizeof(kiln_lr_schedule), base_lr, max_iters, warmup_iters, iters_per_epoch};
}

Policy::Policy(const std::string& component_name)
    : vtable_(*static_cast<const kiln_lr_policy_vtable*>(component(component_name).vtable)) {}

Policy::~Policy() { vtable_.destroy(instance_); }

Status Policy::create(Options& options, const kiln_lr_schedule& schedule) {
  vtable_.destroy(instance_);
  instance_ = nullptr;
  return Status(vtable_.create(fake_host(), options.get(), &schedule, &instance_));
}

Status Policy::try_at(int64_t iter, double* lr) const {
  return Status(vtable_.lr_at(instance_, iter, lr));
}

double Policy::at(int64_t iter) const {
  double lr = std::nan("");
  Status status = try_at(iter, &lr);
  EXPECT_EQ(status, nullptr) << "iter " << iter << ": " << describe(status.get());
  return lr;
}

}  // namespace kiln::lr_test
