#include "lr_harness.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "kiln_test_paths.h"

namespace kiln::lr_test {
namespace {

kiln_status* make_status(int32_t code, const char* message) {
  return new kiln_status{code, message != nullptr ? message : ""};
}
void log(int32_t level, const char* component, const char* message) {
  std::fprintf(stderr, "[fake host %d] %s: %s\n", level, component, message);
}
int32_t status_code(const kiln_status* status) { return status->code; }
const char* status_message(const kiln_status* status) { return status->message.c_str(); }
void free_status(kiln_status* status) { delete status; }

struct Opened {
  const kiln_plugin_descriptor* descriptor;
  uint32_t probe;
};

const Opened& opened() {
  static const Opened library = [] {
    const std::string path = std::string(KILN_PLUGIN_DIR) + "/libkiln_step.so";
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) throw std::runtime_error("dlopen " + path + ": " + dlerror());
    auto probe = reinterpret_cast<kiln_plugin_abi_fn>(dlsym(handle, KILN_PLUGIN_PROBE_SYMBOL));
    auto get = reinterpret_cast<kiln_plugin_get_fn>(dlsym(handle, KILN_PLUGIN_ENTRY_SYMBOL));
    if (probe == nullptr || get == nullptr) throw std::runtime_error(path + ": no entry points");
    return Opened{get(), probe()};
  }();
  return library;
}

// "[1, 2, 3]" -> {1, 2, 3}; the default literals of int-list options.
std::vector<int64_t> parse_int_list(const std::string& literal) {
  std::vector<int64_t> out;
  const char* p = literal.c_str();
  while (*p != '\0') {
    if (*p == '-' || (*p >= '0' && *p <= '9')) {
      char* end = nullptr;
      out.push_back(std::strtoll(p, &end, 10));
      p = end;
    } else {
      ++p;
    }
  }
  return out;
}

}  // namespace

const kiln_host_api* fake_host() {
  // Only the status and log services: the other slots stay NULL, so a policy that touched
  // tensors, streams or collectives would crash the test.
  static const kiln_host_api api = [] {
    kiln_host_api a{};
    a.struct_size = sizeof(kiln_host_api);
    a.abi_major = KILN_ABI_MAJOR;
    a.abi_minor = KILN_ABI_MINOR;
    a.make_status = make_status;
    a.log = log;
    a.status_code = status_code;
    a.status_message = status_message;
    a.free_status = free_status;
    return a;
  }();
  return &api;
}

std::string describe(const kiln_status* status) {
  if (status == nullptr) return "";
  return "code " + std::to_string(status->code) + ": " + status->message;
}

const kiln_plugin_descriptor& library() { return *opened().descriptor; }
uint32_t library_probe() { return opened().probe; }

const kiln_component_descriptor& component(const std::string& name) {
  const kiln_plugin_descriptor& d = library();
  for (size_t i = 0; i < d.component_count; ++i) {
    if (name == d.components[i]->name) return *d.components[i];
  }
  throw std::runtime_error("kiln_step has no component " + name);
}

bool Options::has(const std::string& name) const {
  for (const Entry& e : entries_) {
    if (e.name == name) return true;
  }
  return false;
}

Options& Options::set_bool(const std::string& name, bool value) {
  Entry e{name, {}, {}};
  e.value.type = KILN_OPT_BOOL;
  e.value.bool_value = value ? 1 : 0;
  entries_.push_back(std::move(e));
  return *this;
}

Options& Options::set_int(const std::string& name, int64_t value) {
  Entry e{name, {}, {}};
  e.value.type = KILN_OPT_INT;
  e.value.int_value = value;
  entries_.push_back(std::move(e));
  return *this;
}

Options& Options::set_float(const std::string& name, double value) {
  Entry e{name, {}, {}};
  e.value.type = KILN_OPT_FLOAT;
  e.value.float_value = value;
  entries_.push_back(std::move(e));
  return *this;
}

Options& Options::set_int_list(const std::string& name, std::vector<int64_t> values) {
  Entry e{name, {}, std::move(values)};
  e.value.type = KILN_OPT_INT_LIST;
  entries_.push_back(std::move(e));
  return *this;
}

Options& Options::fill_defaults(const kiln_component_descriptor& spec) {
  for (size_t i = 0; i < spec.option_count; ++i) {
    const kiln_option_spec& o = spec.options[i];
    if (o.default_value == nullptr || has(o.name)) continue;
    const std::string literal = o.default_value;
    switch (o.type) {
      case KILN_OPT_BOOL:
        set_bool(o.name, literal == "true");
        break;
      case KILN_OPT_INT:
        set_int(o.name, std::strtoll(literal.c_str(), nullptr, 10));
        break;
      case KILN_OPT_FLOAT:
        set_float(o.name, std::strtod(literal.c_str(), nullptr));
        break;
      case KILN_OPT_INT_LIST:
        set_int_list(o.name, parse_int_list(literal));
        break;
      default:
        throw std::runtime_error(std::string("no default parser for option ") + o.name);
    }
  }
  return *this;
}

const kiln_options* Options::get() {
  // Pointers are bound only now, once the entries have stopped moving.
  values_.clear();
  for (Entry& e : entries_) {
    kiln_option_value v = e.value;
    v.struct_size = sizeof(kiln_option_value);
    v.name = e.name.c_str();
    if (v.type == KILN_OPT_INT_LIST) {
      v.int_list = e.int_list.data();
      v.list_length = e.int_list.size();
    }
    values_.push_back(v);
  }
  options_.struct_size = sizeof(kiln_options);
  options_.count = values_.size();
  options_.values = values_.data();
  return &options_;
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
