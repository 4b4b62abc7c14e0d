// Small text helpers shared by the config sources: numbers printed shortest round-trip and
// TOML literals for strings and keys.
#pragma once

#include <string>

namespace kiln::config {

// Shortest text that reads back to the same double ("0.1", "5", "1e-08", "inf", "nan").
std::string format_number(double value);

// The same as a TOML float literal: always has a '.', an exponent, or is inf/nan ("5.0").
std::string format_toml_float(double value);

// A TOML basic string literal with escapes ("\"a\\\"b\"").
std::string quote_toml_string(const std::string& text);

// A TOML key: bare when it only has A-Za-z0-9_- characters, quoted otherwise.
std::string toml_key(const std::string& key);

}  // namespace kiln::config
