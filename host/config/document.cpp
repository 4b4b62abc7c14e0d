#include "config/document.hpp"

#include <algorithm>

namespace kiln::config {

Where where_in_file(const std::string& file, const toml::source_region& source) {
  Where w;
  if (source.begin.line == 0) {
    // Nodes toml++ made up without a position; fall back to the file as a whole.
    w.pos = SourcePos{file, 0, 0};
    w.prefix = file;
    w.group = 1;
    return w;
  }
  w.pos = SourcePos{file, static_cast<int64_t>(source.begin.line),
                    static_cast<int64_t>(source.begin.column)};
  w.prefix = file + ":" + std::to_string(w.pos.line) + ":" + std::to_string(w.pos.column);
  w.group = 0;
  w.major = w.pos.line;
  w.minor = w.pos.column;
  return w;
}

namespace {

bool is_bare_key(const std::string& key) {
  if (key.empty()) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t");
  return text.substr(first, last - first + 1);
}

// The override value: a TOML value when "v = <value>" parses to exactly that, else the text.
std::unique_ptr<toml::table> parse_override_value(const std::string& value) {
  try {
    auto table =
        std::make_unique<toml::table>(toml::parse("v = " + value, std::string_view("--set")));
    if (table->size() == 1 && table->contains("v")) return table;
  } catch (const toml::parse_error&) {
    // Not TOML: a bare string, so `--set data.root=/tmp/x` works unquoted.
  }
  auto table = std::make_unique<toml::table>();
  table->insert("v", value);
  return table;
}

// The key a message starts with ("run.epochz: unknown key; ..." -> "run.epochz"), or "".
std::string leading_key(const std::string& message) {
  const auto colon = message.find(": ");
  if (colon == std::string::npos || colon == 0) return "";
  const std::string key = message.substr(0, colon);
  const bool keyish = std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.' || c == '[' || c == ']';
  });
  return keyish ? key : "";
}

}  // namespace

void Diagnostics::add(const Where& where, const std::string& message) {
  items_.push_back(Item{where, where.prefix + ": " + message, leading_key(message)});
}

void Diagnostics::throw_if_any() const {
  if (items_.empty()) return;
  std::vector<const Item*> sorted;
  for (const auto& item : items_) sorted.push_back(&item);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Item* a, const Item* b) {
    const auto& x = a->where;
    const auto& y = b->where;
    if (x.group != y.group) return x.group < y.group;
    if (x.major != y.major) return x.major < y.major;
    return x.minor < y.minor;
  });
  std::string text;
  for (const auto* item : sorted) {
    if (!text.empty()) text += '\n';
    text += item->text;
  }
  // The first message is where a caller's editor should go.
  throw ConfigError(text, sorted.front()->where.pos, sorted.front()->key);
}

Document::Document(const std::string& text, const std::string& name) : name_(name) {
  try {
    root_ = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    throw ConfigError(
        name + ":" + std::to_string(begin.line) + ":" + std::to_string(begin.column) +
            ": TOML syntax error: " + std::string(e.description()),
        SourcePos{name, static_cast<int64_t>(begin.line), static_cast<int64_t>(begin.column)}, "");
  }
  for (const auto& [key, node] : root_) {
    const Where key_where = where_in_file(name_, key.source());
    Section& s = section(std::string(key.str()), key_where);
    s.node = &node;
    const auto* table = node.as_table();
    if (table == nullptr) continue;
    for (const auto& [sub_key, value] : *table) {
      s.entries.push_back(Entry{std::string(sub_key.str()), &value,
                                where_in_file(name_, sub_key.source()),
                                where_in_file(name_, value.source())});
    }
  }
}

void Document::apply_overrides(const std::vector<std::string>& overrides, Diagnostics& diagnostics,
                               const std::string& only_section) {
  for (std::size_t i = 0; i < overrides.size(); ++i) {
    const std::string& text = overrides[i];
    Where where;
    where.pos = SourcePos{"--set", 0, 0, text};
    where.prefix = "--set " + text;
    where.group = 2;
    where.major = static_cast<int64_t>(i);

    const auto equals = text.find('=');
    const std::string key = trim(text.substr(0, equals));
    const auto dot = key.find('.');
    const bool well_formed = equals != std::string::npos && dot != std::string::npos &&
                             is_bare_key(key.substr(0, dot)) && is_bare_key(key.substr(dot + 1));
    if (!well_formed) {
      if (only_section.empty()) {
        diagnostics.add(where, "expected KEY=VALUE with KEY like section.key");
      }
      continue;
    }
    const std::string section_name = key.substr(0, dot);
    const std::string option = key.substr(dot + 1);
    if (!only_section.empty() && section_name != only_section) continue;

    const std::string value = trim(text.substr(equals + 1));
    override_values_.push_back(parse_override_value(value));
    const toml::node* node = override_values_.back()->get("v");
    // The text as a string too: `--set model.depth=18` gives a string option "18" (the shell
    // already took the quotes a TOML string would need).
    const toml::node* text_node = node;
    if (!node->is_string()) {
      auto as_text = std::make_unique<toml::table>();
      as_text->insert("v", value);
      override_values_.push_back(std::move(as_text));
      text_node = override_values_.back()->get("v");
    }
    Section& s = section(section_name, where);
    Entry entry{option, node, where, where, text_node};
    auto existing = std::find_if(s.entries.begin(), s.entries.end(),
                                 [&](const Entry& e) { return e.key == option; });
    if (existing != s.entries.end()) {
      *existing = entry;
    } else {
      s.entries.push_back(entry);
    }
  }
}

const Section* Document::find(const std::string& section) const {
  for (const auto& s : sections_) {
    if (s.name == section) return &s;
  }
  return nullptr;
}

Where Document::file_where() const {
  Where w;
  w.pos = SourcePos{name_, 0, 0};
  w.prefix = name_;
  w.group = 1;
  return w;
}

Section& Document::section(const std::string& name, const Where& where) {
  for (auto& s : sections_) {
    if (s.name == name) return s;
  }
  sections_.push_back(Section{name, where, nullptr, {}});
  return sections_.back();
}

}  // namespace kiln::config
