#include "plugin_options.hpp"

#include <toml++/toml.h>

#include <stdexcept>

#include "config/value_check.hpp"

namespace kiln::bench {

config::OptionSet plugin_options(const plugin::Component& component,
                                 const std::map<std::string, std::string>& overrides) {
  const kiln_component_descriptor& d = *component.descriptor;
  const std::string section(component.name());
  config::OptionSet set;
  for (size_t i = 0; i < d.option_count; ++i) {
    const kiln_option_spec& spec = d.options[i];
    auto it = overrides.find(spec.name);
    std::optional<config::Value> value;
    std::string error;
    if (it != overrides.end()) {
      toml::table doc = toml::parse("v = " + it->second);
      value = config::check_value(*doc.get("v"), spec, section + "." + spec.name, true, error);
    } else {
      value = config::parse_default(spec);
      if (!value) error = section + "." + spec.name + ": required, and the benchmark sets none";
    }
    if (!value) throw std::runtime_error(error);
    set.set(spec.name, *value);
  }
  return set;
}

std::string describe(const config::OptionSet& options) {
  std::string text;
  for (const auto& [name, value] : options.entries()) {
    text += (text.empty() ? "" : ", ") + name + " = " + value.to_toml();
  }
  return text;
}

}  // namespace kiln::bench
