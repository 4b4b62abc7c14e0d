#include "config/options.hpp"

#include "config/toml_text.hpp"

namespace kiln::config {

std::string SourcePos::text() const {
  if (line > 0) return file + ":" + std::to_string(line) + ":" + std::to_string(column);
  if (!argument.empty()) return "--set " + argument;
  return file;
}

namespace {

template <typename T>
std::string join_list(const std::vector<T>& items, std::string (*format)(const T&)) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += format(items[i]);
  }
  return out + "]";
}

std::string int_text(const int64_t& v) { return std::to_string(v); }
std::string float_text(const double& v) { return format_toml_float(v); }
std::string string_text(const std::string& v) { return quote_toml_string(v); }

// Typed getters are only reached through host code that knows the schema, so a mismatch is a
// programming error rather than a user error.
const Value& typed(const OptionSet& set, const std::string& name, int32_t type) {
  const Value& v = set.get(name);
  if (v.type != type) {
    throw std::logic_error("option '" + name + "' is " + option_type_name(v.type) + ", not " +
                           option_type_name(type));
  }
  return v;
}

}  // namespace

const char* option_type_name(int32_t option_type) {
  switch (option_type) {
    case KILN_OPT_BOOL:
      return "bool";
    case KILN_OPT_INT:
      return "int";
    case KILN_OPT_FLOAT:
      return "float";
    case KILN_OPT_STRING:
      return "string";
    case KILN_OPT_INT_LIST:
      return "int list";
    case KILN_OPT_FLOAT_LIST:
      return "float list";
    case KILN_OPT_STRING_LIST:
      return "string list";
    default:
      return "?";
  }
}

std::string Value::to_toml() const {
  switch (type) {
    case KILN_OPT_BOOL:
      return bool_value ? "true" : "false";
    case KILN_OPT_INT:
      return std::to_string(int_value);
    case KILN_OPT_FLOAT:
      return format_toml_float(float_value);
    case KILN_OPT_STRING:
      return quote_toml_string(string_value);
    case KILN_OPT_INT_LIST:
      return join_list(int_list, int_text);
    case KILN_OPT_FLOAT_LIST:
      return join_list(float_list, float_text);
    case KILN_OPT_STRING_LIST:
      return join_list(string_list, string_text);
    default:
      throw std::logic_error("value of unknown option type " + std::to_string(type));
  }
}

void OptionSet::set(const std::string& name, Value value) {
  for (auto& entry : entries_) {
    if (entry.first == name) {
      entry.second = std::move(value);
      return;
    }
  }
  entries_.emplace_back(name, std::move(value));
}

bool OptionSet::has(const std::string& name) const {
  for (const auto& entry : entries_) {
    if (entry.first == name) return true;
  }
  return false;
}

const Value& OptionSet::get(const std::string& name) const {
  for (const auto& entry : entries_) {
    if (entry.first == name) return entry.second;
  }
  throw std::out_of_range("option '" + name + "' is not set");
}

bool OptionSet::get_bool(const std::string& name) const {
  return typed(*this, name, KILN_OPT_BOOL).bool_value;
}

int64_t OptionSet::get_int(const std::string& name) const {
  return typed(*this, name, KILN_OPT_INT).int_value;
}

double OptionSet::get_float(const std::string& name) const {
  const Value& v = get(name);
  if (v.type == KILN_OPT_INT) return static_cast<double>(v.int_value);
  return typed(*this, name, KILN_OPT_FLOAT).float_value;
}

const std::string& OptionSet::get_string(const std::string& name) const {
  return typed(*this, name, KILN_OPT_STRING).string_value;
}

const std::vector<int64_t>& OptionSet::get_int_list(const std::string& name) const {
  return typed(*this, name, KILN_OPT_INT_LIST).int_list;
}

const std::vector<double>& OptionSet::get_float_list(const std::string& name) const {
  return typed(*this, name, KILN_OPT_FLOAT_LIST).float_list;
}

const std::vector<std::string>& OptionSet::get_string_list(const std::string& name) const {
  return typed(*this, name, KILN_OPT_STRING_LIST).string_list;
}

const kiln_options* OptionSet::c_view() const {
  // Pointer arrays first, so the values below never point into a vector that later grows.
  c_string_lists_.assign(entries_.size(), {});
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    for (const auto& s : entries_[i].second.string_list) c_string_lists_[i].push_back(s.c_str());
  }
  c_values_.assign(entries_.size(), kiln_option_value{});
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const Value& v = entries_[i].second;
    kiln_option_value& c = c_values_[i];
    c.struct_size = sizeof(kiln_option_value);
    c.name = entries_[i].first.c_str();
    c.type = v.type;
    c.bool_value = v.bool_value ? 1 : 0;
    c.int_value = v.int_value;
    c.float_value = v.float_value;
    c.string_value = v.string_value.c_str();
    switch (v.type) {
      case KILN_OPT_INT_LIST:
        c.int_list = v.int_list.data();
        c.list_length = v.int_list.size();
        break;
      case KILN_OPT_FLOAT_LIST:
        c.float_list = v.float_list.data();
        c.list_length = v.float_list.size();
        break;
      case KILN_OPT_STRING_LIST:
        c.string_list = c_string_lists_[i].data();
        c.list_length = c_string_lists_[i].size();
        break;
      default:
        break;
    }
  }
  c_options_.struct_size = sizeof(kiln_options);
  c_options_.count = c_values_.size();
  c_options_.values = c_values_.data();
  return &c_options_;
}

}  // namespace kiln::config
