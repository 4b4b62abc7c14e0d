// The components of kiln_adam_family, one per source file; plugin.cpp lists them.
#ifndef KILN_PLUGINS_OPTIMIZER_ADAM_FAMILY_COMPONENTS_HPP_
#define KILN_PLUGINS_OPTIMIZER_ADAM_FAMILY_COMPONENTS_HPP_

#include "kiln/sdk.hpp"

namespace kiln::adam_family {

extern const kiln_component_descriptor kNAdam;   // nadam.cpp
extern const kiln_component_descriptor kRAdam;   // radam.cpp
extern const kiln_component_descriptor kAdamax;  // adamax.cpp

}  // namespace kiln::adam_family

#endif  // KILN_PLUGINS_OPTIMIZER_ADAM_FAMILY_COMPONENTS_HPP_
