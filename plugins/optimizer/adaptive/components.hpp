// The components of kiln_adaptive, one per source file; plugin.cpp lists them.
#ifndef KILN_PLUGINS_OPTIMIZER_ADAPTIVE_COMPONENTS_HPP_
#define KILN_PLUGINS_OPTIMIZER_ADAPTIVE_COMPONENTS_HPP_

#include "kiln/sdk.hpp"

namespace kiln::adaptive {

extern const kiln_component_descriptor kAdagrad;    // adagrad.cpp
extern const kiln_component_descriptor kAdadelta;   // adadelta.cpp
extern const kiln_component_descriptor kAdafactor;  // adafactor.cpp

}  // namespace kiln::adaptive

#endif  // KILN_PLUGINS_OPTIMIZER_ADAPTIVE_COMPONENTS_HPP_
