// Loads a model plugin library with dlopen and drives its C ABI: options, create, destroy.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "fake_host.hpp"
#include "kiln/torch.hpp"

namespace kiln_test {

// Option values as a host would pass them; the storage stays put while the set lives.
class OptionSet {
 public:
  OptionSet& integer(const std::string& name, int64_t value);
  OptionSet& floating(const std::string& name, double value);
  OptionSet& boolean(const std::string& name, bool value);
  OptionSet& string(const std::string& name, const std::string& value);
  OptionSet& int_list(const std::string& name, std::vector<int64_t> values);
  // The kiln_options view (valid until the set changes or dies).
  const kiln_options* get();

 private:
  kiln_option_value& add(const std::string& name, int32_t type);
  std::deque<std::string> strings_;
  std::deque<std::vector<int64_t>> lists_;
  std::vector<kiln_option_value> values_;
  kiln_options options_{};
};

struct Created {
  StatusPtr status;                    // null on success
  std::shared_ptr<kiln::Model> model;  // set on success
};

// One plugin library from KILN_PLUGIN_DIR, loaded once per process and never unloaded.
class ModelPlugin {
 public:
  // `file` is the library's file name ("libkiln_mlp.so"). Throws when it cannot be loaded.
  static const ModelPlugin& get(const std::string& file);

  uint32_t probe() const { return probe_(); }
  const kiln_plugin_descriptor* descriptor() const { return descriptor_; }
  const kiln_model_vtable* vtable() const;

  // Runs create with the fake host (and destroy on the handle, the model living on).
  Created create(OptionSet& options, int64_t channels, int64_t height, int64_t width,
                 int64_t num_classes) const;

 private:
  explicit ModelPlugin(const std::string& file);
  kiln_plugin_abi_fn probe_ = nullptr;
  const kiln_plugin_descriptor* descriptor_ = nullptr;
};

}  // namespace kiln_test
