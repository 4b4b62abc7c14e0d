// Validated option values of one TOML table (a core section or a component's options) and the
// C view (kiln_options) handed to plugins.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kiln/abi.h"

namespace kiln::config {

// Where a value came from: a file position, a --set override, or the schema default.
struct SourcePos {
  std::string file;  // path as given, "--set" for overrides, "<default>" for defaults
  int64_t line = 0;  // 1-based; 0 when not from a file
  int64_t column = 0;
  std::string argument{};  // an override's whole "KEY=VALUE" argument
  // As messages start: "file:line:column", "--set KEY=VALUE", or the file alone.
  std::string text() const;
};

// A configuration error. what() is the full message, e.g.
// "pipe.toml:12:3: optimizer.momentun: unknown key; did you mean 'momentum'?"
// Where it can, it also keeps where it points (the first message's position and key) for the C
// API's status_location.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  ConfigError(const std::string& what, SourcePos pos, std::string key)
      : std::runtime_error(what), pos_(std::move(pos)), key_(std::move(key)), located_(true) {}
  bool located() const noexcept { return located_; }
  const SourcePos& pos() const noexcept { return pos_; }    // file "" unless located
  const std::string& key() const noexcept { return key_; }  // "section.key", or ""

 private:
  SourcePos pos_;
  std::string key_;
  bool located_ = false;
};

// An option type's short name, as `kiln plugins describe` and docs/config.md list it: bool, int,
// float, string, int list, float list, string list.
const char* option_type_name(int32_t option_type);

// One validated value (typed per KILN_OPT_*).
struct Value {
  int32_t type = 0;  // KILN_OPT_*
  bool bool_value = false;
  int64_t int_value = 0;
  double float_value = 0.0;
  std::string string_value;
  std::vector<int64_t> int_list;
  std::vector<double> float_list;
  std::vector<std::string> string_list;
  SourcePos pos;
  bool is_default = false;      // filled from the schema default
  std::string to_toml() const;  // the value as a TOML literal ("0.9", "\"x\"", "[1, 2]")
};

// The validated options of one table, in schema order, every schema option present.
class OptionSet {
 public:
  void set(const std::string& name, Value value);  // used by the validator
  bool has(const std::string& name) const;
  const Value& get(const std::string& name) const;  // throws std::out_of_range if absent
  bool get_bool(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;  // also accepts an int value
  const std::string& get_string(const std::string& name) const;
  const std::vector<int64_t>& get_int_list(const std::string& name) const;
  const std::vector<double>& get_float_list(const std::string& name) const;
  const std::vector<std::string>& get_string_list(const std::string& name) const;
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  // A C view valid while this OptionSet lives and is not modified.
  const kiln_options* c_view() const;

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  mutable std::vector<kiln_option_value> c_values_;
  mutable std::vector<std::vector<const char*>> c_string_lists_;
  mutable kiln_options c_options_{};
};

}  // namespace kiln::config
