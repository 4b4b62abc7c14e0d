#include "config/locate.hpp"

#include <cctype>
#include <vector>

namespace kiln::config {
namespace {

// The options table of `section` that holds `name`, or nullptr.
const OptionSet* table_with(const Pipeline& p, const std::string& section,
                            const std::string& name) {
  if (const ComponentChoice* c = choice_of(p, section)) {
    if (c->core.has(name)) return &c->core;
    if (c->options.has(name)) return &c->options;
    return nullptr;
  }
  const OptionSet* plain = section == "run"          ? &p.run
                           : section == "lr_scaling" ? &p.lr_scaling
                           : section == "dist"       ? &p.dist
                           : section == "memory"     ? &p.memory
                           : section == "loss"       ? &p.loss
                           : section == "ema"        ? &p.ema
                                                     : nullptr;
  return plain != nullptr && plain->has(name) ? plain : nullptr;
}

// The words of `text` that could be keys: [A-Za-z_][A-Za-z0-9_]*, in order.
std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::string word;
  auto flush = [&] {
    if (!word.empty() && !std::isdigit(static_cast<unsigned char>(word[0]))) out.push_back(word);
    word.clear();
  };
  for (char ch : text) {
    if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') {
      word += ch;
    } else {
      flush();
    }
  }
  flush();
  return out;
}

}  // namespace

const ComponentChoice* choice_of(const Pipeline& p, const std::string& section) {
  if (section == "model") return &p.model;
  if (section == "norm") return &p.norm;
  if (section == "optimizer") return &p.optimizer;
  if (section == "lr_policy") return &p.lr_policy;
  if (section == "precision") return &p.precision;
  if (section == "data") return &p.dataset;
  return nullptr;
}

SourcePos key_source(const Pipeline& p, const std::string& key) {
  const auto dot = key.find('.');
  const std::string section = key.substr(0, dot);
  const std::string name = dot == std::string::npos ? std::string() : key.substr(dot + 1);
  const ComponentChoice* choice = choice_of(p, section);
  const SourcePos* pos = nullptr;
  if (choice != nullptr && name == (section == "data" ? "dataset" : "name")) {
    pos = &choice->name_pos;
  } else if (const OptionSet* table = table_with(p, section, name)) {
    pos = &table->get(name).pos;
  }
  if (pos != nullptr && pos->file != "<default>") return *pos;
  const auto table = p.table_pos.find(section);
  return table != p.table_pos.end() ? table->second : SourcePos{p.path, 0, 0};
}

std::string key_location(const Pipeline& p, const std::string& key) {
  return key_source(p, key).text();
}

ConfigError located_error(const Pipeline& p, const std::string& key, const std::string& message) {
  // Some reasons already start with their key ("memory.checkpoint: …"): not twice.
  const bool keyed = message.rfind(key + ": ", 0) == 0;
  SourcePos pos = key_source(p, key);
  return ConfigError(pos.text() + ": " + (keyed ? message : key + ": " + message), pos, key);
}

std::string key_named_in(const ComponentChoice& choice, const std::string& message) {
  std::string first_default;
  for (const std::string& word : words(message)) {
    for (const OptionSet* table : {&choice.options, &choice.core}) {
      if (word == "name" || !table->has(word)) continue;
      if (!table->get(word).is_default) return choice.section + "." + word;
      if (first_default.empty()) first_default = choice.section + "." + word;
    }
  }
  if (!first_default.empty()) return first_default;
  // A message that names a file but no option ("…/data_batch_1.bin: truncated"): the option
  // whose path (or folder of it) the message holds, the longest such value.
  std::string by_value;
  size_t longest = 0;
  for (const auto& [name, value] : choice.options.entries()) {
    const std::string& text = value.string_value;
    if (value.type != KILN_OPT_STRING || text.size() <= longest) continue;
    if (message.find(text) != std::string::npos) {
      by_value = choice.section + "." + name;
      longest = text.size();
    }
  }
  if (!by_value.empty()) return by_value;
  // [data] names its component with `dataset`; the others with `name`.
  return choice.section + (choice.section == "data" ? ".dataset" : ".name");
}

}  // namespace kiln::config
