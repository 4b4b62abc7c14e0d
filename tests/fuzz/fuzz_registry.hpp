// The component registry the fuzz target validates against, built without the Loader (which
// links LibTorch): the plain-C plugins' own descriptors, dlopen'ed from the fuzz build, plus
// stand-in descriptors for the torch-bound plugins carrying copies of their option schemas.
#pragma once

#include <string>

#include "plugin/registry.hpp"

namespace kiln::fuzz {

// Adds the components of every lib*.so in `plugin_dir` and the stand-ins. Aborts on a setup
// failure (missing folder, a library that does not load, a duplicate name): the fuzz results
// would mean nothing without the full component set.
plugin::Registry make_registry(const std::string& plugin_dir);

}  // namespace kiln::fuzz
