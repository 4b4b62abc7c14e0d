#include "plugin/loader.hpp"

#include <dlfcn.h>
#include <torch/version.h>

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <boost/filesystem.hpp>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include "config/pipeline.hpp"
#include "config/value_check.hpp"
#include "kiln/dataset.h"
#include "kiln/lr_policy.h"
#include "kiln/model.h"
#include "kiln/norm.h"
#include "kiln/optimizer.h"
#include "kiln/precision.h"
#include "plugin/elf_needed.hpp"
#include "plugin/plugin_call.hpp"
#include "plugin/status.hpp"

namespace kiln::plugin {
// boost::filesystem rather than std::filesystem: libtorch exports its own (older) copies of
// std::filesystem symbols, which can win symbol resolution and crash.
namespace fs = boost::filesystem;
namespace {

std::string abi_text(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

#ifdef _GLIBCXX_USE_CXX11_ABI
constexpr int kHostCxx11Abi = _GLIBCXX_USE_CXX11_ABI;
#else
constexpr int kHostCxx11Abi = 0;
#endif

// The vtable of a component: its size and which slots are required, per kind, and the ABI
// minor that introduced the kind.
struct VtableRule {
  size_t v1_size;
  std::vector<std::pair<const char*, size_t>> required;  // slot name, byte offset
  uint32_t since_minor = 0;
};

VtableRule vtable_rule(int32_t kind) {
  switch (kind) {
    case KILN_COMPONENT_OPTIMIZER:
      return {KILN_OPTIMIZER_VTABLE_V1_SIZE,
              {{"create", offsetof(kiln_optimizer_vtable, create)},
               {"destroy", offsetof(kiln_optimizer_vtable, destroy)},
               {"step", offsetof(kiln_optimizer_vtable, step)}}};
    case KILN_COMPONENT_LR_POLICY:
      return {KILN_LR_POLICY_VTABLE_V1_SIZE,
              {{"create", offsetof(kiln_lr_policy_vtable, create)},
               {"destroy", offsetof(kiln_lr_policy_vtable, destroy)},
               {"lr_at", offsetof(kiln_lr_policy_vtable, lr_at)}}};
    case KILN_COMPONENT_NORM:
      return {KILN_NORM_VTABLE_V1_SIZE,
              {{"create", offsetof(kiln_norm_vtable, create)},
               {"destroy", offsetof(kiln_norm_vtable, destroy)},
               {"forward", offsetof(kiln_norm_vtable, forward)},
               {"backward", offsetof(kiln_norm_vtable, backward)}}};
    case KILN_COMPONENT_PRECISION:
      return {KILN_PRECISION_VTABLE_V1_SIZE,
              {{"create", offsetof(kiln_precision_vtable, create)},
               {"destroy", offsetof(kiln_precision_vtable, destroy)},
               {"policy", offsetof(kiln_precision_vtable, policy)}}};
    case KILN_COMPONENT_MODEL:
      return {KILN_MODEL_VTABLE_V1_SIZE,
              {{"create", offsetof(kiln_model_vtable, create)},
               {"destroy", offsetof(kiln_model_vtable, destroy)}}};
    case KILN_COMPONENT_DATASET:
      return {KILN_DATASET_VTABLE_V1_SIZE,
              {{"create", offsetof(kiln_dataset_vtable, create)},
               {"destroy", offsetof(kiln_dataset_vtable, destroy)},
               {"info", offsetof(kiln_dataset_vtable, info)},
               {"probe", offsetof(kiln_dataset_vtable, probe)},
               {"decode", offsetof(kiln_dataset_vtable, decode)}},
              7};
    default:
      return {0, {}};
  }
}

// The pipeline table a component kind's options are written in: its own, but [data] for a
// dataset, beside the loader's keys.
std::string section_of(const std::string& kind) { return kind == "dataset" ? "data" : kind; }

// The keys the host owns in the [section] of a component kind; none where the kind has no core
// section of its own.
const std::vector<kiln_option_spec>& host_keys(const std::string& kind) {
  static const std::vector<kiln_option_spec> none;
  const std::string section = section_of(kind);
  const auto& sections = config::core_sections();
  if (std::find(sections.begin(), sections.end(), section) == sections.end()) return none;
  return config::core_schema(section);
}

// The keys the host owns in the [section] of a component kind, for messages.
std::string reserved_names(const std::string& section) {
  std::string out;
  for (const kiln_option_spec& core : host_keys(section)) {
    out += (out.empty() ? "" : ", ") + std::string(core.name);
  }
  return out;
}

// "field 'reserved' is 3, not zero": plugins fill reserved fields with zero, so a later ABI can
// give them a meaning without old plugins passing garbage for it.
std::string nonzero_reserved(int32_t value) {
  return "field 'reserved' is " + std::to_string(value) + ", not zero";
}

// The library's LibTorch against the host's, for every component kind: C++ objects and ATen
// calls of another build cannot be trusted even on host memory. Returns the reason it is
// refused, or "" when it records none or the host's.
std::string check_torch(const kiln_plugin_descriptor* d) {
  if (d->torch_version == nullptr) return {};
  if (std::string(d->torch_version) == TORCH_VERSION && d->torch_cxx11_abi == kHostCxx11Abi) {
    return {};
  }
  return "built against LibTorch " + std::string(d->torch_version) + " (C++11 ABI " +
         std::to_string(d->torch_cxx11_abi) + "), this host uses LibTorch " + TORCH_VERSION +
         " (C++11 ABI " + std::to_string(kHostCxx11Abi) + ")";
}

// A library built for ABI 1.6 or later that links LibTorch must record which one (1.5 asked it
// of models only, so an older library is taken at its word). Linking is what the file shows:
// its DT_NEEDED names.
std::string check_torch_recorded(const std::string& path, const kiln_plugin_descriptor* d) {
  if (d->torch_version != nullptr || d->abi_minor < 6) return {};
  for (const std::string& needed : elf_needed(path)) {
    if (needed.rfind("libtorch", 0) == 0 || needed.rfind("libc10", 0) == 0) {
      return "links " + needed +
             " but records no LibTorch (torch_version is NULL); since ABI 1.6 a library that "
             "uses LibTorch records the one it was built against (kiln_add_plugin(... TORCH) "
             "with KILN_PLUGIN_DESCRIPTOR_INIT does)";
    }
  }
  return {};
}

// Checks one component descriptor of a library built for ABI 1.`abi_minor`; returns the reason
// it is refused, or "" when it is fine.
// Why a required slot of `c`'s vtable is NULL (`who` names the component), or "". Since 1.14
// an optimizer with step_all needs no step.
std::string missing_slot(const kiln_component_descriptor* c, const VtableRule& rule,
                         uint32_t abi_minor, const std::string& who) {
  const auto* bytes = static_cast<const unsigned char*>(c->vtable);
  const size_t vsize = *reinterpret_cast<const size_t*>(bytes);
  bool steps_all = false;
  if (c->kind == KILN_COMPONENT_OPTIMIZER && abi_minor >= 14 &&
      vsize >= KILN_SIZE_UP_TO(kiln_optimizer_vtable, step_all)) {
    void* fn = nullptr;
    std::memcpy(&fn, bytes + offsetof(kiln_optimizer_vtable, step_all), sizeof(fn));
    steps_all = fn != nullptr;
  }
  for (const auto& [slot, offset] : rule.required) {
    void* fn = nullptr;
    std::memcpy(&fn, bytes + offset, sizeof(fn));
    if (fn != nullptr || (steps_all && std::strcmp(slot, "step") == 0)) continue;
    return who + ": required slot '" + slot + "' is NULL" +
           (c->kind == KILN_COMPONENT_OPTIMIZER && std::strcmp(slot, "step") == 0
                ? " (an optimizer of ABI 1.14 may give step_all instead)"
                : "");
  }
  return {};
}

std::string check_component(const kiln_component_descriptor* c, size_t index, uint32_t abi_minor) {
  const std::string where = "component #" + std::to_string(index);
  if (c == nullptr) return where + " is NULL";
  if (c->struct_size < KILN_COMPONENT_DESCRIPTOR_V1_SIZE) {
    return where + " descriptor is " + std::to_string(c->struct_size) +
           " bytes, smaller than the " + std::to_string(KILN_COMPONENT_DESCRIPTOR_V1_SIZE) +
           " bytes of ABI 1.0";
  }
  if (c->name == nullptr || c->name[0] == '\0') return where + " has no name";
  const std::string who = "component '" + std::string(c->name) + "'";
  VtableRule rule = vtable_rule(c->kind);
  if (rule.v1_size == 0) return who + " has unknown kind " + std::to_string(c->kind);
  const std::string kind = kind_name(c->kind);
  // A kind the library's ABI did not have yet: its vtable cannot be the one this host reads.
  if (abi_minor < rule.since_minor) {
    return who + " (" + kind + ") needs Kiln ABI 1." + std::to_string(rule.since_minor) +
           " or later; the library is built for 1." + std::to_string(abi_minor);
  }
  if (c->reserved != 0) return who + " (" + kind + ") descriptor " + nonzero_reserved(c->reserved);
  if (c->capabilities == nullptr) return who + " (" + kind + ") declares no capabilities";
  if (c->capabilities->struct_size < KILN_SIZE_UP_TO(kiln_capabilities, attributes)) {
    return who + " (" + kind + ") capabilities struct is too small (" +
           std::to_string(c->capabilities->struct_size) + " bytes)";
  }
  if (c->option_count > 0 && c->options == nullptr) {
    return who + " (" + kind + ") declares " + std::to_string(c->option_count) +
           " options but no options array";
  }
  for (size_t i = 0; i < c->option_count; ++i) {
    const kiln_option_spec& o = c->options[i];
    if (o.struct_size < KILN_SIZE_UP_TO(kiln_option_spec, doc)) {
      return who + " (" + kind + ") option #" + std::to_string(i) + " spec is too small (" +
             std::to_string(o.struct_size) + " bytes)";
    }
    if (o.name == nullptr || o.name[0] == '\0') {
      return who + " (" + kind + ") option #" + std::to_string(i) + " has no name";
    }
    if (o.reserved != 0) {
      return who + " (" + kind + ") option '" + o.name + "' " + nonzero_reserved(o.reserved);
    }
    if (o.type < KILN_OPT_BOOL || o.type > KILN_OPT_STRING_LIST) {
      return who + " (" + kind + ") option '" + o.name + "' has unknown type " +
             std::to_string(o.type);
    }
    if (o.default_value != nullptr && !config::parse_default(o)) {
      return who + " (" + kind + ") option '" + o.name + "': default " + o.default_value +
             " is not a valid " + config::want_name(o.type);
    }
    // The component's options share its pipeline table with the keys the host owns there
    // (an optimizer's lr and weight_decay, …): one of those names could never reach it.
    for (const kiln_option_spec& core : host_keys(kind)) {
      if (std::strcmp(core.name, o.name) == 0) {
        return who + " (" + kind + ") option '" + o.name + "' is a name the host reserves in [" +
               section_of(kind) + "] (" + reserved_names(kind) + "; see docs/abi.md)";
      }
    }
  }
  if (c->vtable == nullptr) return who + " (" + kind + ") has no vtable";
  const auto* bytes = static_cast<const unsigned char*>(c->vtable);
  size_t vsize = *reinterpret_cast<const size_t*>(bytes);
  if (vsize < rule.v1_size) {
    return who + " (" + kind + ") vtable is " + std::to_string(vsize) +
           " bytes, smaller than the " + std::to_string(rule.v1_size) + " bytes of ABI 1." +
           std::to_string(rule.since_minor);
  }
  return missing_slot(c, rule, abi_minor, who + " (" + kind + ")");
}

// Accepted libraries, never unloaded (see LibraryLoader).
void keep_loaded(boost::dll::shared_library library) {
  static std::mutex mutex;
  static auto* libraries = new std::vector<boost::dll::shared_library>();  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  libraries->push_back(std::move(library));
}

// Calls into the library being loaded: an exception that escapes refuses the library.
template <typename Call>
auto call_library(const std::string& path, const char* entry, Call&& call) -> decltype(call()) {
  try {
    return call();
  } catch (...) {
    throw LoadError(path, escaped_exception_text(entry));
  }
}

}  // namespace

void LibraryLoader::accept(const kiln_plugin_descriptor* d, const std::string& path,
                           const std::string& origin, bool from_file, Registry& registry) {
  if (d->struct_size < KILN_PLUGIN_DESCRIPTOR_V1_SIZE) {
    throw LoadError(path, "plugin descriptor is " + std::to_string(d->struct_size) +
                              " bytes, smaller than the " +
                              std::to_string(KILN_PLUGIN_DESCRIPTOR_V1_SIZE) + " bytes of ABI 1.0");
  }
  if (d->abi_major != KILN_ABI_MAJOR || d->abi_minor > KILN_ABI_MINOR) {
    throw LoadError(path, "descriptor declares Kiln ABI " + abi_text(d->abi_major, d->abi_minor) +
                              ", this host speaks " + abi_text(KILN_ABI_MAJOR, KILN_ABI_MINOR));
  }
  if (d->reserved != 0) throw LoadError(path, "plugin descriptor " + nonzero_reserved(d->reserved));
  if (std::string reason = check_torch(d); !reason.empty()) throw LoadError(path, reason);
  // Only a file shows what it links; a program's own descriptor is taken at its word.
  if (from_file) {
    if (std::string reason = check_torch_recorded(path, d); !reason.empty()) {
      throw LoadError(path, reason);
    }
  }
  if (d->component_count > 0 && d->components == nullptr) {
    throw LoadError(path, "descriptor lists " + std::to_string(d->component_count) +
                              " components but no component array");
  }
  std::vector<std::string> names_here;
  for (size_t i = 0; i < d->component_count; ++i) {
    const kiln_component_descriptor* c = d->components[i];
    if (std::string reason = check_component(c, i, d->abi_minor); !reason.empty())
      throw LoadError(path, reason);
    const std::string name = c->name;
    if (c->kind == KILN_COMPONENT_MODEL && d->torch_version == nullptr) {
      throw LoadError(path, "component '" + name +
                                "' is a model (torch-bound) but the library records no torch "
                                "version");
    }
    if (std::find(names_here.begin(), names_here.end(), name) != names_here.end()) {
      throw LoadError(path, "component name '" + name + "' appears twice in this library");
    }
    if (const Component* other = registry.find_any(name)) {
      throw LoadError(path, "component '" + name + "' (" + kind_name(c->kind) +
                                ") is already provided by " + other->library_path);
    }
    names_here.push_back(name);
  }
  if (d->init != nullptr) {
    if (kiln_status* status = call_library(path, "init", [&] { return d->init(host_); })) {
      throw LoadError(path, "init failed: " + take_message(status));
    }
  }
  for (size_t i = 0; i < d->component_count; ++i) {
    registry.add(Component{d->components[i], d, origin});
  }
}

void LibraryLoader::add_descriptor(const kiln_plugin_descriptor* d, const std::string& origin,
                                   Registry& registry) {
  if (d == nullptr) throw LoadError(origin, "plugin descriptor is NULL");
  accept(d, origin, origin, false, registry);
}

void LibraryLoader::load_library(const std::string& path, Registry& registry) {
  namespace dll = boost::dll;
  dll::shared_library lib;
  try {
    // Resolve every symbol now so a missing one fails here with the loader's own text; keep
    // symbols local so two plugins cannot interpose on each other.
    lib.load(path, dll::load_mode::rtld_now | dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    // Boost wraps the dynamic loader's text and appends an unrelated errno string; keep the
    // loader's own words when they are there.
    std::string what = e.what();
    const std::string marker = "(dlerror system message: ";
    if (const auto at = what.find(marker); at != std::string::npos) {
      const auto end = what.rfind(')');
      if (end != std::string::npos && end > at) {
        what = what.substr(at + marker.size(), end - at - marker.size());
      }
    }
    throw LoadError(path, "cannot load: " + what);
  }
  const bool has_probe = lib.has(KILN_PLUGIN_PROBE_SYMBOL);
  const bool has_entry = lib.has(KILN_PLUGIN_ENTRY_SYMBOL);
  if (!has_probe && !has_entry) {
    throw LoadError(path,
                    "not a Kiln plugin: it exports neither kiln_plugin_abi nor kiln_plugin_get");
  }
  if (has_probe) {
    auto* probe = lib.get<uint32_t()>(KILN_PLUGIN_PROBE_SYMBOL);
    const uint32_t packed = call_library(path, KILN_PLUGIN_PROBE_SYMBOL, probe);
    uint32_t major = packed >> 16, minor = packed & 0xFFFFu;
    if (major != KILN_ABI_MAJOR) {
      throw LoadError(path, "built for Kiln ABI " + abi_text(major, minor) + ", this host speaks " +
                                abi_text(KILN_ABI_MAJOR, KILN_ABI_MINOR) +
                                " (the major version must match)");
    }
    if (minor > KILN_ABI_MINOR) {
      throw LoadError(path, "built for Kiln ABI " + abi_text(major, minor) +
                                ", newer than this host's " +
                                abi_text(KILN_ABI_MAJOR, KILN_ABI_MINOR) + "; upgrade Kiln");
    }
  }
  if (!has_entry) throw LoadError(path, "exports kiln_plugin_abi but not kiln_plugin_get");
  auto* entry = lib.get<const kiln_plugin_descriptor*()>(KILN_PLUGIN_ENTRY_SYMBOL);
  const kiln_plugin_descriptor* d = call_library(path, KILN_PLUGIN_ENTRY_SYMBOL, entry);
  if (d == nullptr) throw LoadError(path, "kiln_plugin_get returned NULL");
  accept(d, path, fs::absolute(path).lexically_normal().string(), true, registry);
  keep_loaded(std::move(lib));
}

void LibraryLoader::load_directory(const std::string& dir, Registry& registry,
                                   std::vector<std::string>& refused) {
  boost::system::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    refused.push_back(dir + ": plugin folder does not exist");
    return;
  }
  std::vector<std::string> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    if (entry.path().extension() == ".so" && fs::is_regular_file(entry.status())) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    try {
      load_library(file, registry);
    } catch (const LoadError& e) {
      refused.push_back(e.what());
    }
  }
}

std::string builtin_plugin_dir() {
  boost::system::error_code ec;
  // The file holding this code: the kiln executable, or libkiln for a program using the C API.
  std::vector<fs::path> homes;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&builtin_plugin_dir), &info) != 0 &&
      info.dli_fname != nullptr && std::strchr(info.dli_fname, '/') != nullptr) {
    homes.push_back(fs::canonical(info.dli_fname, ec).parent_path());
  }
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) homes.push_back(exe.parent_path());
  // Build tree: bin/ or lib/ beside plugins/. Installed: bin/../lib/kiln/plugins, or
  // lib/kiln/plugins beside libkiln.
  for (const fs::path& home : homes) {
    if (home.empty()) continue;
    for (fs::path candidate : {home / ".." / "plugins", home / ".." / "lib" / "kiln" / "plugins",
                               home / "kiln" / "plugins"}) {
      if (fs::is_directory(candidate, ec)) return fs::weakly_canonical(candidate, ec).string();
    }
  }
  return {};
}

std::vector<std::string> plugin_search_path(const std::vector<std::string>& extra) {
  std::vector<std::string> dirs;
  boost::system::error_code ec;
  if (std::string builtin = builtin_plugin_dir(); !builtin.empty()) dirs.push_back(builtin);
  if (const char* env = std::getenv("KILN_PLUGIN_PATH")) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ':')) {
      if (!item.empty()) dirs.push_back(item);
    }
  }
  for (const auto& d : extra) dirs.push_back(d);
  // The same folder twice would refuse every plugin in it as a duplicate.
  std::vector<std::string> unique;
  for (const auto& d : dirs) {
    std::string canon = fs::weakly_canonical(d, ec).string();
    if (std::find(unique.begin(), unique.end(), canon) == unique.end()) unique.push_back(canon);
  }
  return unique;
}

Registry load_all(LibraryLoader& loader, const std::vector<std::string>& dirs,
                  std::vector<std::string>& refused) {
  Registry registry;
  for (const auto& dir : dirs) loader.load_directory(dir, registry, refused);
  return registry;
}

}  // namespace kiln::plugin
