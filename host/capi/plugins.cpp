#include "capi/plugins.hpp"

#include <map>
#include <mutex>

#include "capi/guard.hpp"
#include "plugin/host_api.hpp"

struct kiln_plugin_list {
  std::shared_ptr<const kiln::capi::PluginSet> set;
};

namespace kiln::capi {

std::shared_ptr<const PluginSet> plugins_for(const std::vector<std::string>& extra_dirs) {
  static std::mutex lock;
  static std::map<std::vector<std::string>, std::shared_ptr<const PluginSet>> loaded;
  const std::vector<std::string> dirs = plugin::plugin_search_path(extra_dirs);
  std::lock_guard<std::mutex> guard(lock);
  auto& slot = loaded[dirs];
  if (!slot) {
    auto set = std::make_shared<PluginSet>();
    set->loader = std::make_unique<plugin::LibraryLoader>(plugin::host_api());
    set->registry = plugin::load_all(*set->loader, dirs, set->refused);
    slot = std::move(set);
  }
  return slot;
}

kiln_status* plugins_list(const char* const* extra_dirs, size_t count, kiln_plugin_list** out) {
  return guarded(KILN_ERR_INTERNAL, [&]() -> kiln_status* {
    if (out == nullptr) return make_status(KILN_ERR_INVALID_ARGUMENT, "plugins_list: out is NULL");
    *out = nullptr;
    if (count > 0 && extra_dirs == nullptr) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "plugins_list: extra_dirs is NULL");
    }
    std::vector<std::string> dirs;
    for (size_t i = 0; i < count; ++i) {
      if (extra_dirs[i] == nullptr) {
        return make_status(KILN_ERR_INVALID_ARGUMENT, "plugins_list: extra_dirs has a NULL");
      }
      dirs.emplace_back(extra_dirs[i]);
    }
    *out = new kiln_plugin_list{plugins_for(dirs)};
    return nullptr;
  });
}

size_t plugins_count(const kiln_plugin_list* list) {
  return list != nullptr ? list->set->registry.all().size() : 0;
}

kiln_status* plugins_get(const kiln_plugin_list* list, size_t index, kiln_plugin_info* out) {
  return guarded(KILN_ERR_INTERNAL, [&]() -> kiln_status* {
    if (list == nullptr || out == nullptr) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "plugins_get: list or out is NULL");
    }
    if (kiln_status* s = check_size(out->struct_size, KILN_PLUGIN_INFO_V1_SIZE, "kiln_plugin_info"))
      return s;
    const auto& all = list->set->registry.all();
    if (index >= all.size()) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "plugins_get: index " + std::to_string(index) +
                                                        " is not below " +
                                                        std::to_string(all.size()));
    }
    const plugin::Component& c = all[index];
    out->name = c.descriptor->name;
    out->kind = plugin::kind_name(c.kind());
    out->summary = c.descriptor->summary != nullptr ? c.descriptor->summary : "";
    out->library = c.library_path.c_str();
    out->version = c.descriptor->version;
    out->abi_major = c.plugin->abi_major;
    out->abi_minor = c.plugin->abi_minor;
    return nullptr;
  });
}

size_t plugins_refused_count(const kiln_plugin_list* list) {
  return list != nullptr ? list->set->refused.size() : 0;
}

const char* plugins_refused(const kiln_plugin_list* list, size_t index) {
  if (list == nullptr || index >= list->set->refused.size()) return nullptr;
  return list->set->refused[index].c_str();
}

void plugins_release(kiln_plugin_list* list) { delete list; }

}  // namespace kiln::capi
