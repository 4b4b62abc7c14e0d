// Plugin libraries for C API callers: loaded once per set of folders and kept for the process
// (the loader never unloads a library, and a plugin's init runs once).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "plugin/loader.hpp"
#include "plugin/registry.hpp"

namespace kiln::capi {

struct PluginSet {
  std::unique_ptr<plugin::LibraryLoader> loader;
  plugin::Registry registry;
  std::vector<std::string> refused;  // "<path>: <reason>" of each refused library
};

// The plugins of the built-in folder, KILN_PLUGIN_PATH and `extra_dirs`, loaded on first use.
// Thread-safe. Throws on errors other than refusals.
std::shared_ptr<const PluginSet> plugins_for(const std::vector<std::string>& extra_dirs);

// The C functions behind kiln_api's plugins_* slots.
kiln_status* plugins_list(const char* const* extra_dirs, size_t count, kiln_plugin_list** out);
size_t plugins_count(const kiln_plugin_list* list);
kiln_status* plugins_get(const kiln_plugin_list* list, size_t index, kiln_plugin_info* out);
size_t plugins_refused_count(const kiln_plugin_list* list);
const char* plugins_refused(const kiln_plugin_list* list, size_t index);
void plugins_release(kiln_plugin_list* list);

}  // namespace kiln::capi
