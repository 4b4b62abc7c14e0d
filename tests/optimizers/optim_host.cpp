#include "optim_host.hpp"

#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <dlfcn.h>

#include <cstdio>
#include <stdexcept>

#include "kiln/torch.hpp"
#include "kiln_test_paths.h"

namespace kiln::test {
namespace {

kiln_status* make_status(int32_t code, const char* message) {
  return new kiln_status{code, message != nullptr ? message : ""};
}

void log(int32_t level, const char* component, const char* message) {
  std::fprintf(stderr, "[optim host %d] %s: %s\n", level, component, message);
}

// Creates state as host/plugin/host_api.cpp does: row-major *_LIKE_PARAM tensors (whatever the
// parameter's strides), float32 0-dim step counters on the parameter's device.
kiln_status* state_tensor(kiln_call_context* ctx, size_t param_index, const char* name,
                          int32_t init, DLTensor* out, int32_t* created) {
  if (param_index >= ctx->fail_state_from)
    return make_status(KILN_ERR_OUT_OF_MEMORY, "fake host: state refused");
  if (param_index >= ctx->params.size()) {
    return make_status(KILN_ERR_INVALID_ARGUMENT, "state_tensor: parameter index out of range");
  }
  const at::Tensor& param = ctx->params[param_index];
  auto key = std::make_pair(param_index, std::string(name));
  auto it = ctx->state.find(key);
  const bool is_new = it == ctx->state.end();
  if (is_new) {
    at::Tensor t;
    switch (init) {
      case KILN_STATE_ZEROS_LIKE_PARAM:
        t = at::zeros_like(param, at::MemoryFormat::Contiguous);
        break;
      case KILN_STATE_COPY_OF_GRAD:
        t = ctx->grads.at(param_index).clone(at::MemoryFormat::Contiguous);
        break;
      case KILN_STATE_SCALAR_F64:
        t = at::zeros({}, at::kDouble);
        break;
      case KILN_STATE_SCALAR_LIKE_PARAM:
        t = at::zeros({}, param.options().dtype(at::kFloat));
        break;
      default:
        return make_status(KILN_ERR_INVALID_ARGUMENT, "state_tensor: unknown init kind");
    }
    it = ctx->state.emplace(key, t).first;
    ctx->state_init[key] = init;
  }
  *out = kiln::as_dltensor(it->second);
  if (created != nullptr) *created = is_new ? 1 : 0;
  return nullptr;
}

void* current_stream(DLDevice) { return nullptr; }
int32_t rank(kiln_call_context*) { return 0; }
int32_t world_size(kiln_call_context*) { return 1; }
// One process: every collective is the identity.
kiln_status* allreduce(kiln_call_context*, DLTensor*, int32_t) { return nullptr; }
kiln_status* broadcast(kiln_call_context*, DLTensor*, int32_t) { return nullptr; }
kiln_status* allgather(kiln_call_context*, const DLTensor* in, DLTensor* out) {
  kiln::as_tensor(*out).copy_(kiln::as_tensor(*in).reshape(kiln::as_tensor(*out).sizes()));
  return nullptr;
}
kiln_status* create_norm_layer(const kiln_norm_request*, kiln_torch_module**) {
  return make_status(KILN_ERR_UNSUPPORTED, "optim host builds no norm layers");
}

int32_t status_code(const kiln_status* status) { return status->code; }
const char* status_message(const kiln_status* status) { return status->message.c_str(); }
void free_status(kiln_status* status) { delete status; }

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

}  // namespace

const kiln_host_api* optim_host() {
  static const kiln_host_api api = {
      sizeof(kiln_host_api), KILN_ABI_MAJOR, KILN_ABI_MINOR, make_status, log,       state_tensor,
      current_stream,        rank,           world_size,     allreduce,   broadcast, allgather,
      create_norm_layer,     status_code,    status_message, free_status};
  return &api;
}

std::string describe(const kiln_status* status) {
  if (status == nullptr) return "";
  return "code " + std::to_string(status->code) + ": " + status->message;
}

const kiln_component_descriptor* Plugin::component(const std::string& name) const {
  for (size_t i = 0; i < descriptor->component_count; ++i) {
    if (name == descriptor->components[i]->name) return descriptor->components[i];
  }
  return nullptr;
}

const Plugin& builtin(const std::string& library) {
  static std::map<std::string, Plugin> opened;
  auto it = opened.find(library);
  if (it == opened.end()) it = opened.emplace(library, open_plugin(KILN_PLUGIN_DIR, library)).first;
  return it->second;
}

const kiln_optimizer_vtable& optimizer_vtable(const std::string& library,
                                              const std::string& component) {
  const kiln_component_descriptor* c = builtin(library).component(component);
  if (c == nullptr) throw std::runtime_error(library + " has no component " + component);
  return *static_cast<const kiln_optimizer_vtable*>(c->vtable);
}

Options& Options::set_bool(const std::string& name, bool value) {
  kiln_option_value v{};
  v.type = KILN_OPT_BOOL;
  v.bool_value = value ? 1 : 0;
  names_.push_back(name);
  values_.push_back(v);
  return *this;
}

Options& Options::set_float(const std::string& name, double value) {
  kiln_option_value v{};
  v.type = KILN_OPT_FLOAT;
  v.float_value = value;
  names_.push_back(name);
  values_.push_back(v);
  return *this;
}

const kiln_options* Options::get() {
  // Pointers are bound only now, once the vectors have stopped growing.
  for (size_t i = 0; i < values_.size(); ++i) {
    values_[i].struct_size = sizeof(kiln_option_value);
    values_[i].name = names_[i].c_str();
  }
  options_.struct_size = sizeof(kiln_options);
  options_.count = values_.size();
  options_.values = values_.data();
  return &options_;
}

}  // namespace kiln::test
