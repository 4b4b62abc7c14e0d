// Loads a model plugin library with dlopen and drives its C ABI: options, create, destroy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kiln/torch.hpp"
#include "options.hpp"
#include "test_norm.hpp"

namespace kiln_test {

// Option values as a host would pass them.
using OptionSet = kiln::test::Options;

struct Created {
  StatusPtr status;                    // null on success
  std::shared_ptr<kiln::Model> model;  // set on success
};

// One plugin library from KILN_PLUGIN_DIR, loaded once per process and never unloaded.
class ModelPlugin {
 public:
  // `file` is the library's file name ("libkiln_mlp.so"). Throws when it cannot be loaded.
  static const ModelPlugin& get(const std::string& file);

  uint32_t probe() const { return plugin_.probe; }
  const kiln_plugin_descriptor* descriptor() const { return plugin_.descriptor; }
  const kiln_model_vtable* vtable() const;

  // Runs create with the fake host (and destroy on the handle, the model living on).
  Created create(OptionSet& options, int64_t channels, int64_t height, int64_t width,
                 int64_t num_classes) const;

 private:
  explicit ModelPlugin(const kiln::test::Plugin& plugin) : plugin_(plugin) {}
  kiln::test::Plugin plugin_;
};

}  // namespace kiln_test
