// The components of kiln_classic, one per source file; plugin.cpp lists them.
#ifndef KILN_PLUGINS_OPTIMIZER_CLASSIC_COMPONENTS_HPP_
#define KILN_PLUGINS_OPTIMIZER_CLASSIC_COMPONENTS_HPP_

#include "kiln/sdk.hpp"

namespace kiln::classic {

extern const kiln_component_descriptor kAsgd;   // asgd.cpp
extern const kiln_component_descriptor kRprop;  // rprop.cpp

}  // namespace kiln::classic

#endif  // KILN_PLUGINS_OPTIMIZER_CLASSIC_COMPONENTS_HPP_
