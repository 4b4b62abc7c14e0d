// One validated option value of the host's (kiln::config::Value) of each scalar type, for tests
// that hand the host's loaders an OptionSet of their own. Header-only: the host's config types
// live in kiln_core, which only the tests that include this link.
#pragma once

#include <cstdint>
#include <string>

#include "config/options.hpp"
#include "kiln/plugin.h"

namespace kiln::test {

inline kiln::config::Value int_value(int64_t v) {
  kiln::config::Value value;
  value.type = KILN_OPT_INT;
  value.int_value = v;
  return value;
}

inline kiln::config::Value float_value(double v) {
  kiln::config::Value value;
  value.type = KILN_OPT_FLOAT;
  value.float_value = v;
  return value;
}

inline kiln::config::Value bool_value(bool v) {
  kiln::config::Value value;
  value.type = KILN_OPT_BOOL;
  value.bool_value = v;
  return value;
}

inline kiln::config::Value string_value(const std::string& v) {
  kiln::config::Value value;
  value.type = KILN_OPT_STRING;
  value.string_value = v;
  return value;
}

}  // namespace kiln::test
