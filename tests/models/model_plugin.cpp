#include "model_plugin.hpp"

#include <map>
#include <stdexcept>

namespace kiln_test {

const ModelPlugin& ModelPlugin::get(const std::string& file) {
  static std::map<std::string, std::unique_ptr<ModelPlugin>> loaded;
  auto it = loaded.find(file);
  if (it == loaded.end()) {
    // "libkiln_mlp.so" -> the built-in library "kiln_mlp".
    const std::string prefix = "lib", suffix = ".so";
    if (file.size() <= prefix.size() + suffix.size() ||
        file.compare(0, prefix.size(), prefix) != 0 ||
        file.compare(file.size() - suffix.size(), suffix.size(), suffix) != 0) {
      throw std::runtime_error("not a plugin file name: " + file);
    }
    const std::string library =
        file.substr(prefix.size(), file.size() - prefix.size() - suffix.size());
    const kiln::test::Plugin& plugin = kiln::test::builtin(library);
    it = loaded.emplace(file, std::unique_ptr<ModelPlugin>(new ModelPlugin(plugin))).first;
  }
  return *it->second;
}

const kiln_model_vtable* ModelPlugin::vtable() const {
  return static_cast<const kiln_model_vtable*>(plugin_.descriptor->components[0]->vtable);
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
  created.status.reset(vtable()->create(model_host(), options.get(), &input, &handle));
  if (handle != nullptr) {
    created.model = kiln::model_from_handle(handle);
    vtable()->destroy(handle);
  }
  return created;
}

}  // namespace kiln_test
