#include "fuzz_registry.hpp"

#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kiln/plugin.h"

namespace kiln::fuzz {

namespace {

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "config_fuzz setup: %s\n", message.c_str());
  std::abort();
}

constexpr size_t kSpec = sizeof(kiln_option_spec);

// Option schemas of the torch-bound plugins (plugins/model/*, plugins/norm/batchnorm,
// plugins/optimizer/*); only names, types, bounds, defaults and choices matter for validation.
const kiln_option_spec kMlp[] = {
    {kSpec, "hidden", KILN_OPT_INT_LIST, 1, 0, 0, 1.0, 0.0, "[256, 128]", nullptr, "widths"},
    {kSpec, "dropout", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.0", nullptr, "dropout"},
    {kSpec, "norm_layers", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "false", nullptr, "norm layers"},
};
const kiln_option_spec kResnet[] = {
    {kSpec, "depth", KILN_OPT_STRING, 0, 0, 0, 0.0, 0.0, "\"small\"", "small,18,50", "depth"},
    {kSpec, "width", KILN_OPT_INT, 1, 0, 0, 1.0, 0.0, "16", nullptr, "width"},
    {kSpec, "blocks", KILN_OPT_INT_LIST, 1, 0, 0, 1.0, 0.0, "[1, 1, 1]", nullptr, "blocks"},
};
const kiln_option_spec kVit[] = {
    {kSpec, "patch_size", KILN_OPT_INT, 1, 0, 0, 1.0, 0.0, "4", nullptr, "patch side"},
    {kSpec, "dim", KILN_OPT_INT, 1, 0, 0, 1.0, 0.0, "128", nullptr, "token width"},
    {kSpec, "depth", KILN_OPT_INT, 1, 0, 0, 1.0, 0.0, "6", nullptr, "blocks"},
    {kSpec, "heads", KILN_OPT_INT, 1, 0, 0, 1.0, 0.0, "4", nullptr, "heads"},
    {kSpec, "mlp_ratio", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "2.0", nullptr, "mlp ratio"},
    {kSpec, "pool", KILN_OPT_STRING, 0, 0, 0, 0.0, 0.0, "\"cls\"", "cls,mean", "pooling"},
    {kSpec, "dropout", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.0", nullptr, "dropout"},
};
const kiln_option_spec kBatchnorm[] = {
    {kSpec, "momentum", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.1", nullptr, "momentum"},
    {kSpec, "eps", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "1e-5", nullptr, "eps"},
    {kSpec, "affine", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "true", nullptr, "affine"},
    {kSpec, "track_running_stats", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "true", nullptr, "stats"},
};
const kiln_option_spec kSgd[] = {
    {kSpec, "momentum", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.9", nullptr, "momentum"},
    {kSpec, "dampening", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.0", nullptr, "dampening"},
    {kSpec, "nesterov", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "false", nullptr, "nesterov"},
};
const kiln_option_spec kAdam[] = {
    {kSpec, "beta1", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.9", nullptr, "beta1"},
    {kSpec, "beta2", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.999", nullptr, "beta2"},
    {kSpec, "eps", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "1e-8", nullptr, "eps"},
    {kSpec, "amsgrad", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "false", nullptr, "amsgrad"},
};
const kiln_option_spec kLamb[] = {
    {kSpec, "beta1", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.9", nullptr, "beta1"},
    {kSpec, "beta2", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.999", nullptr, "beta2"},
    {kSpec, "eps", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "1e-6", nullptr, "eps"},
    {kSpec, "max_grad_norm", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "0.0", nullptr, "clipping"},
    {kSpec, "bias_correction", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "true", nullptr, "correction"},
};
const kiln_option_spec kRmsprop[] = {
    {kSpec, "alpha", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.99", nullptr, "alpha"},
    {kSpec, "eps", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "1e-8", nullptr, "eps"},
    {kSpec, "momentum", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.0", nullptr, "momentum"},
    {kSpec, "centered", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "false", nullptr, "centered"},
};

const kiln_capabilities kCaps = {sizeof(kiln_capabilities), KILN_CAP_DEVICE_CPU, 0, nullptr};

template <size_t N>
kiln_component_descriptor stand_in(int32_t kind, const char* name,
                                   const kiln_option_spec (&options)[N]) {
  return kiln_component_descriptor{sizeof(kiln_component_descriptor), kind,   0, name,    {1, 0, 0},
                                   "stand-in for the fuzz target",    &kCaps, N, options, nullptr};
}

// Static storage: the registry keeps pointers to these for the life of the process.
const kiln_component_descriptor kStandIns[] = {
    stand_in(KILN_COMPONENT_MODEL, "mlp", kMlp),
    stand_in(KILN_COMPONENT_MODEL, "resnet", kResnet),
    stand_in(KILN_COMPONENT_MODEL, "vit", kVit),
    stand_in(KILN_COMPONENT_NORM, "batchnorm", kBatchnorm),
    stand_in(KILN_COMPONENT_OPTIMIZER, "sgd", kSgd),
    stand_in(KILN_COMPONENT_OPTIMIZER, "adam", kAdam),
    stand_in(KILN_COMPONENT_OPTIMIZER, "adamw", kAdam),
    stand_in(KILN_COMPONENT_OPTIMIZER, "lamb", kLamb),
    stand_in(KILN_COMPONENT_OPTIMIZER, "rmsprop", kRmsprop),
};

void add_checked(plugin::Registry& registry, plugin::Component component) {
  if (const plugin::Component* other = registry.find_any(component.name())) {
    fail("component '" + std::string(component.name()) + "' from " + component.library_path +
         " is already provided by " + other->library_path);
  }
  registry.add(std::move(component));
}

std::vector<std::string> libraries_in(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) fail("plugin folder " + dir + " does not exist");
  std::vector<std::string> out;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0) {
      out.push_back(dir + "/" + name);
    }
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  if (out.empty()) fail("no plugins in " + dir);
  return out;
}

}  // namespace

plugin::Registry make_registry(const std::string& plugin_dir) {
  plugin::Registry registry;
  for (const auto& path : libraries_in(plugin_dir)) {
    // Never closed: the registry points into the library's static data.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) fail(path + ": " + dlerror());
    auto get = reinterpret_cast<kiln_plugin_get_fn>(dlsym(handle, KILN_PLUGIN_ENTRY_SYMBOL));
    if (get == nullptr) fail(path + ": no " KILN_PLUGIN_ENTRY_SYMBOL);
    const kiln_plugin_descriptor* d = get();
    if (d == nullptr || d->abi_major != KILN_ABI_MAJOR) fail(path + ": unusable descriptor");
    for (size_t i = 0; i < d->component_count; ++i) {
      add_checked(registry, plugin::Component{d->components[i], d, path});
    }
  }
  for (const auto& c : kStandIns) {
    add_checked(registry, plugin::Component{&c, nullptr, "<stand-in>/" + std::string(c.name)});
  }
  return registry;
}

}  // namespace kiln::fuzz
