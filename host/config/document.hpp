// A pipeline document before validation: the sections and keys of a TOML file plus --set
// overrides, each remembering where it came from, and the collected error messages.
#pragma once

#include <toml++/toml.h>

#include <memory>
#include <string>
#include <vector>

#include "config/options.hpp"

namespace kiln::config {

// Where something came from, and where its messages sort.
struct Where {
  SourcePos pos;
  std::string prefix;  // message prefix: "file:line:col", "--set KEY=VALUE" or "file"
  int group = 0;       // message order: 0 file positions, 1 no position, 2 overrides
  int64_t major = 0;   // line (group 0) or override index (group 2)
  int64_t minor = 0;   // column (group 0)
};

// Where a node of `file` sits (the file as a whole for nodes without a position).
Where where_in_file(const std::string& file, const toml::source_region& source);

struct Entry {
  std::string key;
  const toml::node* node = nullptr;  // owned by the Document
  Where key_where;                   // for "unknown key"
  Where value_where;                 // for type, range and choice errors
  // An override's value as the string it was typed as (owned by the Document), for string
  // options; null for file entries, where TOML's own types stand.
  const toml::node* text = nullptr;
};

struct Section {
  std::string name;
  Where where;
  const toml::node* node = nullptr;  // the file's value for the section; null if only overrides
  std::vector<Entry> entries;
};

// Error messages of one document; thrown together, in file order, overrides last.
class Diagnostics {
 public:
  void add(const Where& where, const std::string& message);
  bool empty() const { return items_.empty(); }
  // Throws ConfigError with every message joined by "\n" when there is any.
  void throw_if_any() const;

 private:
  struct Item {
    Where where;
    std::string text;
    std::string key;  // the key the message is about, or ""
  };
  std::vector<Item> items_;
};

class Document {
 public:
  // Parses `text`; a syntax error throws ConfigError right away.
  Document(const std::string& text, const std::string& name);
  Document(const Document&) = delete;
  Document& operator=(const Document&) = delete;

  // Adds "section.key=value" overrides over the file's keys. Malformed ones are reported to
  // `diagnostics`. With `only_section`, overrides of other sections (and malformed ones) are
  // ignored.
  void apply_overrides(const std::vector<std::string>& overrides, Diagnostics& diagnostics,
                       const std::string& only_section = "");

  const std::string& name() const { return name_; }
  const std::vector<Section>& sections() const { return sections_; }
  const Section* find(const std::string& section) const;
  // Where for messages about something absent from the file: just the file name.
  Where file_where() const;

 private:
  Section& section(const std::string& name, const Where& where);

  std::string name_;
  toml::table root_;
  std::vector<std::unique_ptr<toml::table>> override_values_;
  std::vector<Section> sections_;
};

}  // namespace kiln::config
