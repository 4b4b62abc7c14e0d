#include "model_plugin.hpp"

#include <dlfcn.h>

#include <map>
#include <stdexcept>

#include "kiln_test_paths.h"

namespace kiln_test {

kiln_option_value& OptionSet::add(const std::string& name, int32_t type) {
  strings_.push_back(name);
  kiln_option_value value{};
  value.struct_size = sizeof(value);
  value.name = strings_.back().c_str();
  value.type = type;
  values_.push_back(value);
  return values_.back();
}

OptionSet& OptionSet::integer(const std::string& name, int64_t value) {
  add(name, KILN_OPT_INT).int_value = value;
  return *this;
}

OptionSet& OptionSet::floating(const std::string& name, double value) {
  add(name, KILN_OPT_FLOAT).float_value = value;
  return *this;
}

OptionSet& OptionSet::boolean(const std::string& name, bool value) {
  add(name, KILN_OPT_BOOL).bool_value = value ? 1 : 0;
  return *this;
}

OptionSet& OptionSet::string(const std::string& name, const std::string& value) {
  kiln_option_value& slot = add(name, KILN_OPT_STRING);
  strings_.push_back(value);  // a deque: earlier c_str() pointers stay valid
  slot.string_value = strings_.back().c_str();
  return *this;
}

OptionSet& OptionSet::int_list(const std::string& name, std::vector<int64_t> values) {
  kiln_option_value& slot = add(name, KILN_OPT_INT_LIST);
  lists_.push_back(std::move(values));
  slot.int_list = lists_.back().data();
  slot.list_length = lists_.back().size();
  return *this;
}

const kiln_options* OptionSet::get() {
  options_.struct_size = sizeof(options_);
  options_.count = values_.size();
  options_.values = values_.data();
  return &options_;
}

const ModelPlugin& ModelPlugin::get(const std::string& file) {
  static std::map<std::string, std::unique_ptr<ModelPlugin>> loaded;
  auto it = loaded.find(file);
  if (it == loaded.end()) {
    it = loaded.emplace(file, std::unique_ptr<ModelPlugin>(new ModelPlugin(file))).first;
  }
  return *it->second;
}

ModelPlugin::ModelPlugin(const std::string& file) {
  const std::string path = std::string(KILN_PLUGIN_DIR) + "/" + file;
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) throw std::runtime_error("dlopen " + path + ": " + dlerror());
  probe_ = reinterpret_cast<kiln_plugin_abi_fn>(dlsym(library, KILN_PLUGIN_PROBE_SYMBOL));
  auto entry = reinterpret_cast<kiln_plugin_get_fn>(dlsym(library, KILN_PLUGIN_ENTRY_SYMBOL));
  if (probe_ == nullptr || entry == nullptr) {
    throw std::runtime_error(path + " lacks the plugin entry points");
  }
  descriptor_ = entry();
}

const kiln_model_vtable* ModelPlugin::vtable() const {
  return static_cast<const kiln_model_vtable*>(descriptor_->components[0]->vtable);
}

Created ModelPlugin::create(OptionSet& options, int64_t channels, int64_t height, int64_t width,
                            int64_t num_classes) const {
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  input.channels = channels;
  input.height = height;
  input.width = width;
  input.num_classes = num_classes;
  kiln_torch_module* handle = nullptr;
  Created created;
  created.status.reset(vtable()->create(fake_host(), options.get(), &input, &handle));
  if (handle != nullptr) {
    created.model = kiln::model_from_handle(handle);
    vtable()->destroy(handle);
  }
  return created;
}

}  // namespace kiln_test
