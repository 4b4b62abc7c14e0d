// The configuration reference (docs/config.md): every core key of every section and every option
// of every loaded component, generated from the options schemas so it cannot drift.
#pragma once

#include <string>

#include "plugin/registry.hpp"

namespace kiln::config {

// Markdown for all core sections and all components in `registry` (sorted by kind and name).
std::string reference_markdown(const plugin::Registry& registry);

}  // namespace kiln::config
