// Checking one TOML value against one option spec (core or plugin; the same rules for both).
#pragma once

#include <toml++/toml.h>

#include <optional>
#include <string>

#include "config/options.hpp"

namespace kiln::config {

// A spec's bounds in words ("> 0", ">= 1", "in [0, 1]", "> 0 and <= 3.4e+38"); "" without bounds.
std::string bounds_text(const kiln_option_spec& spec);

// The TOML type of a node as messages name it: boolean, integer, float, string, array, table,
// date, time, date-time.
const char* toml_type_name(const toml::node& node);

// What an option type expects, as messages name it: boolean, integer, float, string, array of
// integers, array of numbers, array of strings.
const char* want_name(int32_t option_type);

// Converts `node` per `spec`. On failure returns nullopt and sets `error` to the message without
// its position, e.g. "optimizer.lr: expected float, found string" (`qualified` is
// "optimizer.lr"). Bounds and choices are checked only when `check_bounds`.
std::optional<Value> check_value(const toml::node& node, const kiln_option_spec& spec,
                                 const std::string& qualified, bool check_bounds,
                                 std::string& error);

// The spec's default (a TOML literal) as a Value marked is_default, or nullopt when the literal
// does not parse or does not match the spec's type. Bounds are not checked.
std::optional<Value> parse_default(const kiln_option_spec& spec);

}  // namespace kiln::config
