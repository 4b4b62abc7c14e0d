#include "host_base.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <stdexcept>

#include "kiln_test_paths.h"

namespace kiln::test {
namespace {

void log(int32_t level, const char* component, const char* message) {
  std::fprintf(stderr, "[fake host %d] %s: %s\n", level, component, message);
}
int32_t status_code(const kiln_status* status) { return status->code; }
const char* status_message(const kiln_status* status) { return status->message.c_str(); }
void free_status(kiln_status* status) { delete status; }

}  // namespace

kiln_status* make_status(int32_t code, const char* message) {
  return new kiln_status{code, message != nullptr ? message : ""};
}

std::string describe(const kiln_status* status) {
  if (status == nullptr) return "";
  return "code " + std::to_string(status->code) + ": " + status->message;
}

kiln_host_api status_only_host() {
  kiln_host_api api{};
  api.struct_size = sizeof(kiln_host_api);
  api.abi_major = KILN_ABI_MAJOR;
  api.abi_minor = KILN_ABI_MINOR;
  api.make_status = make_status;
  api.log = log;
  api.status_code = status_code;
  api.status_message = status_message;
  api.free_status = free_status;
  return api;
}

const kiln_component_descriptor* Plugin::component(const std::string& name) const {
  for (size_t i = 0; i < descriptor->component_count; ++i) {
    if (name == descriptor->components[i]->name) return descriptor->components[i];
  }
  return nullptr;
}

Plugin open_plugin(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/lib" + name + ".so";
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) throw std::runtime_error("dlopen " + path + ": " + dlerror());
  auto probe = reinterpret_cast<kiln_plugin_abi_fn>(dlsym(handle, KILN_PLUGIN_PROBE_SYMBOL));
  auto get = reinterpret_cast<kiln_plugin_get_fn>(dlsym(handle, KILN_PLUGIN_ENTRY_SYMBOL));
  if (probe == nullptr || get == nullptr) throw std::runtime_error(path + ": no entry points");
  Plugin plugin;
  plugin.probe = probe();
  plugin.descriptor = get();
  return plugin;
}

const Plugin& builtin(const std::string& library) {
  static std::map<std::string, Plugin> opened;
  auto it = opened.find(library);
  if (it == opened.end()) it = opened.emplace(library, open_plugin(KILN_PLUGIN_DIR, library)).first;
  return it->second;
}

const void* component_vtable(const std::string& library, const std::string& component) {
  const kiln_component_descriptor* c = builtin(library).component(component);
  if (c == nullptr) throw std::runtime_error(library + " has no component " + component);
  return c->vtable;
}

}  // namespace kiln::test
