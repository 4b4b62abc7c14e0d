// Builds the kiln_options a host hands to a plugin's create.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/plugin.h"

namespace kiln::test {

// A kiln_options whose values own their names, strings and lists.
class Options {
 public:
  Options& set_bool(const std::string& name, bool value);
  Options& set_int(const std::string& name, int64_t value);
  Options& set_float(const std::string& name, double value);
  Options& set_string(const std::string& name, const std::string& value);
  Options& set_int_list(const std::string& name, std::vector<int64_t> values);
  Options& set_string_list(const std::string& name, std::vector<std::string> values);
  // Adds every option of `spec` not set yet from its default literal, as the host does.
  Options& fill_defaults(const kiln_component_descriptor& spec);
  // The options view; valid while this object lives and is not modified.
  const kiln_options* get();

 private:
  struct Entry {
    std::string name;
    kiln_option_value value;
    std::string string;
    std::vector<int64_t> int_list;
    std::vector<std::string> string_list;
    std::vector<const char*> string_pointers;
  };
  Options& add(const std::string& name, const kiln_option_value& value);
  bool has(const std::string& name) const;
  std::vector<Entry> entries_;
  std::vector<kiln_option_value> values_;
  kiln_options options_{};
};

}  // namespace kiln::test
