// A component's options as the host would validate them from a pipeline file: each schema
// option's default, or an override given as a TOML literal (checked against the schema's type
// and bounds). Overrides the schema does not know are skipped, so one map can carry the spellings
// different plugins use.
#pragma once

#include <map>
#include <string>

#include "config/options.hpp"
#include "plugin/registry.hpp"

namespace kiln::bench {

// Throws std::runtime_error when an override does not validate or a required option has none.
config::OptionSet plugin_options(const plugin::Component& component,
                                 const std::map<std::string, std::string>& overrides);

// "name = value, ..." of `options`, for the benchmark's notes.
std::string describe(const config::OptionSet& options);

}  // namespace kiln::bench
