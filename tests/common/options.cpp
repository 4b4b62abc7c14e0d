#include "options.hpp"

#include <cstdlib>
#include <stdexcept>
#include <utility>

namespace kiln::test {
namespace {

// "[1, 2, 3]" -> {1, 2, 3}; the default literals of int-list options.
std::vector<int64_t> parse_int_list(const std::string& literal) {
  std::vector<int64_t> out;
  const char* p = literal.c_str();
  while (*p != '\0') {
    if (*p == '-' || (*p >= '0' && *p <= '9')) {
      char* end = nullptr;
      out.push_back(std::strtoll(p, &end, 10));
      p = end;
    } else {
      ++p;
    }
  }
  return out;
}

// "[\"a\", \"b\"]" -> {"a", "b"}; the default literals of string-list options (no escapes).
std::vector<std::string> parse_string_list(const std::string& literal) {
  std::vector<std::string> out;
  size_t at = literal.find('"');
  while (at != std::string::npos) {
    const size_t end = literal.find('"', at + 1);
    if (end == std::string::npos) break;
    out.push_back(literal.substr(at + 1, end - at - 1));
    at = literal.find('"', end + 1);
  }
  return out;
}

kiln_option_value typed(int32_t type) {
  kiln_option_value v{};
  v.type = type;
  return v;
}

}  // namespace

Options& Options::add(const std::string& name, const kiln_option_value& value) {
  entries_.push_back(Entry{name, value, {}, {}, {}, {}});
  return *this;
}

bool Options::has(const std::string& name) const {
  for (const Entry& e : entries_) {
    if (e.name == name) return true;
  }
  return false;
}

Options& Options::set_bool(const std::string& name, bool value) {
  kiln_option_value v = typed(KILN_OPT_BOOL);
  v.bool_value = value ? 1 : 0;
  return add(name, v);
}

Options& Options::set_int(const std::string& name, int64_t value) {
  kiln_option_value v = typed(KILN_OPT_INT);
  v.int_value = value;
  return add(name, v);
}

Options& Options::set_float(const std::string& name, double value) {
  kiln_option_value v = typed(KILN_OPT_FLOAT);
  v.float_value = value;
  return add(name, v);
}

Options& Options::set_string(const std::string& name, const std::string& value) {
  add(name, typed(KILN_OPT_STRING));
  entries_.back().string = value;
  return *this;
}

Options& Options::set_int_list(const std::string& name, std::vector<int64_t> values) {
  add(name, typed(KILN_OPT_INT_LIST));
  entries_.back().int_list = std::move(values);
  return *this;
}

Options& Options::set_string_list(const std::string& name, std::vector<std::string> values) {
  add(name, typed(KILN_OPT_STRING_LIST));
  entries_.back().string_list = std::move(values);
  return *this;
}

Options& Options::fill_defaults(const kiln_component_descriptor& spec) {
  for (size_t i = 0; i < spec.option_count; ++i) {
    const kiln_option_spec& o = spec.options[i];
    if (o.default_value == nullptr || has(o.name)) continue;
    const std::string literal = o.default_value;
    switch (o.type) {
      case KILN_OPT_BOOL:
        set_bool(o.name, literal == "true");
        break;
      case KILN_OPT_INT:
        set_int(o.name, std::strtoll(literal.c_str(), nullptr, 10));
        break;
      case KILN_OPT_FLOAT:
        set_float(o.name, std::strtod(literal.c_str(), nullptr));
        break;
      case KILN_OPT_STRING:
        set_string(o.name, literal);
        break;
      case KILN_OPT_INT_LIST:
        set_int_list(o.name, parse_int_list(literal));
        break;
      case KILN_OPT_STRING_LIST:
        set_string_list(o.name, parse_string_list(literal));
        break;
      default:
        throw std::runtime_error(std::string("no default parser for option ") + o.name);
    }
  }
  return *this;
}

const kiln_options* Options::get() {
  // Pointers are bound only now, once the entries have stopped moving.
  values_.clear();
  for (Entry& e : entries_) {
    kiln_option_value v = e.value;
    v.struct_size = sizeof(kiln_option_value);
    v.name = e.name.c_str();
    if (v.type == KILN_OPT_STRING) v.string_value = e.string.c_str();
    if (v.type == KILN_OPT_INT_LIST) {
      v.int_list = e.int_list.data();
      v.list_length = e.int_list.size();
    }
    if (v.type == KILN_OPT_STRING_LIST) {
      e.string_pointers.clear();
      for (const std::string& item : e.string_list) e.string_pointers.push_back(item.c_str());
      v.string_list = e.string_pointers.data();
      v.list_length = e.string_pointers.size();
    }
    values_.push_back(v);
  }
  options_.struct_size = sizeof(kiln_options);
  options_.count = values_.size();
  options_.values = values_.data();
  return &options_;
}

}  // namespace kiln::test
