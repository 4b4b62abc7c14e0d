#include "config/value_check.hpp"

#include <cmath>
#include <limits>
#include <optional>

#include "config/suggest.hpp"
#include "config/toml_text.hpp"

namespace kiln::config {

std::string bounds_text(const kiln_option_spec& spec) {
  if (!spec.has_min && !spec.has_max) return "";
  // The schema writes "> 0" as ">= the smallest positive double"; say what it means.
  const bool positive = spec.has_min && spec.min == std::numeric_limits<double>::denorm_min();
  const std::string lower = positive ? "> 0" : ">= " + format_number(spec.min);
  if (spec.has_min && spec.has_max && !positive) {
    return "in [" + format_number(spec.min) + ", " + format_number(spec.max) + "]";
  }
  if (spec.has_min && spec.has_max) return lower + " and <= " + format_number(spec.max);
  if (spec.has_min) return lower;
  return "<= " + format_number(spec.max);
}

namespace {

bool in_bounds(const kiln_option_spec& spec, double v) {
  // Written as negations so NaN fails both bounds.
  if (spec.has_min && !(v >= spec.min)) return false;
  if (spec.has_max && !(v <= spec.max)) return false;
  // A bounded option is a range of numbers: infinity is in it only where the bound on its side
  // is infinite itself (clip_norm_type's max = inf), not because nothing caps that side.
  if ((spec.has_min || spec.has_max) && std::isinf(v)) {
    const bool open_side = v > 0 ? spec.has_max && std::isinf(spec.max) && spec.max > 0
                                 : spec.has_min && std::isinf(spec.min) && spec.min < 0;
    if (!open_side) return false;
  }
  return true;
}

std::vector<std::string> split_choices(const char* choices) {
  std::vector<std::string> out;
  std::string current;
  for (const char* p = choices;; ++p) {
    if (*p == ',' || *p == '\0') {
      const auto first = current.find_first_not_of(' ');
      const auto last = current.find_last_not_of(' ');
      out.push_back(first == std::string::npos ? "" : current.substr(first, last - first + 1));
      current.clear();
      if (*p == '\0') break;
    } else {
      current += *p;
    }
  }
  return out;
}

// Checks a number against the bounds; `text` is how the value is printed.
bool bounded(const kiln_option_spec& spec, double v, const std::string& text,
             const std::string& qualified, std::string& error) {
  if (in_bounds(spec, v)) return true;
  error = qualified + ": value " + text + " is out of range; expected " +
          (std::isinf(v) ? "a finite number " : "") + bounds_text(spec);
  return false;
}

bool chosen(const kiln_option_spec& spec, const std::string& v, const std::string& qualified,
            std::string& error) {
  if (spec.choices == nullptr) return true;
  const auto choices = split_choices(spec.choices);
  for (const auto& c : choices) {
    if (c == v) return true;
  }
  std::string list;
  for (std::size_t i = 0; i < choices.size(); ++i) list += (i ? ", " : "") + choices[i];
  const std::optional<std::string> best = nearest(v, choices);
  error = qualified + ": '" + v + "' is not one of: " + list +
          (best ? "; did you mean '" + *best + "'?" : std::string());
  return false;
}

// One list item. Returns false with `error` set when it is of the wrong type or out of bounds.
bool list_item(const toml::node& item, const kiln_option_spec& spec, const std::string& qualified,
               bool check_bounds, Value& out, std::string& error) {
  const auto wrong = [&] {
    error = qualified + ": expected " + want_name(spec.type) + ", found array containing " +
            toml_type_name(item);
    return false;
  };
  switch (spec.type) {
    case KILN_OPT_INT_LIST: {
      const auto* v = item.as_integer();
      if (v == nullptr) return wrong();
      const int64_t x = v->get();
      if (check_bounds &&
          !bounded(spec, static_cast<double>(x), std::to_string(x), qualified, error)) {
        return false;
      }
      out.int_list.push_back(x);
      return true;
    }
    case KILN_OPT_FLOAT_LIST: {
      double x = 0.0;
      if (const auto* f = item.as_floating_point()) {
        x = f->get();
      } else if (const auto* i = item.as_integer()) {
        x = static_cast<double>(i->get());
      } else {
        return wrong();
      }
      if (check_bounds && !bounded(spec, x, format_number(x), qualified, error)) return false;
      out.float_list.push_back(x);
      return true;
    }
    case KILN_OPT_STRING_LIST: {
      const auto* v = item.as_string();
      if (v == nullptr) return wrong();
      if (check_bounds && !chosen(spec, v->get(), qualified, error)) return false;
      out.string_list.push_back(v->get());
      return true;
    }
    default:
      return wrong();
  }
}

}  // namespace

const char* toml_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::string:
      return "string";
    case toml::node_type::array:
      return "array";
    case toml::node_type::table:
      return "table";
    case toml::node_type::date:
      return "date";
    case toml::node_type::time:
      return "time";
    case toml::node_type::date_time:
      return "date-time";
    default:
      return "nothing";
  }
}

const char* want_name(int32_t option_type) {
  switch (option_type) {
    case KILN_OPT_BOOL:
      return "boolean";
    case KILN_OPT_INT:
      return "integer";
    case KILN_OPT_FLOAT:
      return "float";
    case KILN_OPT_STRING:
      return "string";
    case KILN_OPT_INT_LIST:
      return "array of integers";
    case KILN_OPT_FLOAT_LIST:
      return "array of numbers";
    case KILN_OPT_STRING_LIST:
      return "array of strings";
    default:
      return "value of unknown type";
  }
}

std::optional<Value> check_value(const toml::node& node, const kiln_option_spec& spec,
                                 const std::string& qualified, bool check_bounds,
                                 std::string& error) {
  Value out;
  out.type = spec.type;
  const auto wrong = [&] {
    error = qualified + ": expected " + want_name(spec.type) + ", found " + toml_type_name(node);
    return std::nullopt;
  };
  switch (spec.type) {
    case KILN_OPT_BOOL: {
      const auto* v = node.as_boolean();
      if (v == nullptr) return wrong();
      out.bool_value = v->get();
      return out;
    }
    case KILN_OPT_INT: {
      const auto* v = node.as_integer();
      if (v == nullptr) return wrong();
      out.int_value = v->get();
      if (check_bounds && !bounded(spec, static_cast<double>(out.int_value),
                                   std::to_string(out.int_value), qualified, error)) {
        return std::nullopt;
      }
      return out;
    }
    case KILN_OPT_FLOAT: {
      if (const auto* f = node.as_floating_point()) {
        out.float_value = f->get();
      } else if (const auto* i = node.as_integer()) {
        out.float_value = static_cast<double>(i->get());
      } else {
        return wrong();
      }
      if (check_bounds &&
          !bounded(spec, out.float_value, format_number(out.float_value), qualified, error)) {
        return std::nullopt;
      }
      return out;
    }
    case KILN_OPT_STRING: {
      // An integer is its decimal text (depth = 18 for the choice "18"), as --set reads it.
      if (const auto* i = node.as_integer()) {
        out.string_value = std::to_string(i->get());
        if (check_bounds && !chosen(spec, out.string_value, qualified, error)) return std::nullopt;
        return out;
      }
      const auto* v = node.as_string();
      if (v == nullptr) return wrong();
      out.string_value = v->get();
      if (check_bounds && !chosen(spec, out.string_value, qualified, error)) return std::nullopt;
      return out;
    }
    case KILN_OPT_INT_LIST:
    case KILN_OPT_FLOAT_LIST:
    case KILN_OPT_STRING_LIST: {
      // A lone string or number reads as a one-element list (checkpoint = "sqrt", mean =
      // 0.286: data.mean was a float). Integer lists stay lists: hidden = 5 is a mistake.
      const bool lone = spec.type == KILN_OPT_STRING_LIST
                            ? node.is_string()
                            : spec.type == KILN_OPT_FLOAT_LIST && node.is_number();
      if (lone) {
        if (!list_item(node, spec, qualified, check_bounds, out, error)) return std::nullopt;
        return out;
      }
      const auto* array = node.as_array();
      if (array == nullptr) return wrong();
      for (const auto& item : *array) {
        if (!list_item(item, spec, qualified, check_bounds, out, error)) return std::nullopt;
      }
      return out;
    }
    default:
      error = qualified + ": option has unknown type " + std::to_string(spec.type);
      return std::nullopt;
  }
}

std::optional<Value> parse_default(const kiln_option_spec& spec) {
  if (spec.default_value == nullptr) return std::nullopt;
  toml::table table;
  try {
    table = toml::parse(std::string("v = ") + spec.default_value, std::string_view("<default>"));
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
  // A literal like "1\nx = 2" parses but is not one value.
  if (table.size() != 1 || !table.contains("v")) return std::nullopt;
  std::string error;
  auto value = check_value(*table.get("v"), spec, spec.name, false, error);
  if (!value) return std::nullopt;
  value->pos = SourcePos{"<default>", 0, 0};
  value->is_default = true;
  return value;
}

}  // namespace kiln::config
