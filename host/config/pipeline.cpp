#include "config/pipeline.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include "config/document.hpp"
#include "config/suggest.hpp"
#include "config/toml_text.hpp"
#include "config/value_check.hpp"

namespace kiln::config {

namespace {

// A spec in effect for a section; `use_default` is false when a plugin's default is broken (the
// plugin error is reported once, not again as a missing key).
struct SpecRef {
  const kiln_option_spec* spec = nullptr;
  bool use_default = true;
};

using Resolved = std::vector<std::pair<const kiln_option_spec*, Value>>;

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

std::vector<SpecRef> refs(const std::vector<kiln_option_spec>& specs) {
  std::vector<SpecRef> out;
  for (const auto& s : specs) out.push_back(SpecRef{&s, true});
  return out;
}

std::string read_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) throw ConfigError(path + ": cannot open file: " + std::strerror(errno));
  std::string text;
  char buffer[65536];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, n);
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) throw ConfigError(path + ": cannot read file");
  return text;
}

// Why `pattern` cannot be used as a parameter-name regular expression, or "" when it can.
// libstdc++ compiles a regex recursively (frames per term and per group), so a long pattern
// overflows the stack: 100000 characters, or 30000 nested groups, crash a release build.
std::string regex_problem(const std::string& pattern) {
  constexpr std::size_t kMaxPattern = 1000;
  if (pattern.size() > kMaxPattern) {
    return "regular expression is " + std::to_string(pattern.size()) +
           " characters long; at most " + std::to_string(kMaxPattern) + " are allowed";
  }
  try {
    std::regex check(pattern);
  } catch (const std::regex_error& e) {
    return std::string("invalid regular expression: ") + e.what();
  }
  return {};
}

// Checks a section's keys against `specs` and fills defaults; the values come back in spec
// order. Unknown keys are reported only when `report_unknown` (not when the component, and so
// the full key list, is unknown).
Resolved resolve_entries(const Document& doc, const std::string& section, const Section* sec,
                         const std::vector<SpecRef>& specs, bool report_unknown,
                         Diagnostics& diagnostics, const std::set<std::string>& skip = {}) {
  std::map<std::string, Value> given;
  std::set<std::string> seen;
  if (sec != nullptr) {
    if (sec->node != nullptr && !sec->node->is_table()) {
      diagnostics.add(sec->where,
                      section + ": expected table, found " + toml_type_name(*sec->node));
    }
    for (const auto& entry : sec->entries) {
      if (skip.count(entry.key) != 0) continue;  // validated by its own reader
      const SpecRef* ref = nullptr;
      for (const auto& r : specs) {
        if (entry.key == r.spec->name) ref = &r;
      }
      if (ref == nullptr) {
        if (!report_unknown) continue;
        std::vector<std::string> names;
        for (const auto& r : specs) names.emplace_back(r.spec->name);
        const auto best = nearest(entry.key, names);
        diagnostics.add(entry.key_where, section + "." + entry.key + ": unknown key; " +
                                             (best ? "did you mean '" + *best + "'?"
                                                   : "valid keys: " + join(names)));
        continue;
      }
      seen.insert(entry.key);
      std::string error;
      const bool typed_as_text = ref->spec->type == KILN_OPT_STRING && entry.text != nullptr;
      auto value = check_value(typed_as_text ? *entry.text : *entry.node, *ref->spec,
                               section + "." + entry.key, true, error);
      if (!value) {
        diagnostics.add(entry.value_where, error);
        continue;
      }
      value->pos = entry.value_where.pos;
      given[entry.key] = std::move(*value);
    }
  }
  Resolved out;
  for (const auto& ref : specs) {
    const std::string name = ref.spec->name;
    if (auto it = given.find(name); it != given.end()) {
      out.emplace_back(ref.spec, std::move(it->second));
    } else if (seen.count(name) != 0 || !ref.use_default) {
      continue;  // already reported
    } else if (ref.spec->default_value == nullptr) {
      // Where the key belongs: its table's header, or the file when the table is absent.
      diagnostics.add(sec != nullptr ? sec->where : doc.file_where(),
                      section + "." + name + ": required key is missing");
    } else if (auto value = parse_default(*ref.spec)) {
      out.emplace_back(ref.spec, std::move(*value));
    } else {
      // Plugin defaults were checked before; this is a broken core schema.
      throw std::logic_error("core option " + section + "." + name + " has a bad default");
    }
  }
  return out;
}

OptionSet plain_section(const Document& doc, const std::string& section, Diagnostics& diagnostics) {
  OptionSet set;
  const auto values = resolve_entries(doc, section, doc.find(section), refs(core_schema(section)),
                                      true, diagnostics);
  for (const auto& [spec, value] : values) set.set(spec->name, value);
  return set;
}

// The component's name as the section gives it (or its default), and where it came from;
// nullopt when absent or not a string (resolve_entries reports that).
// The component a section names with `key` ("name"; [data]'s "dataset"), its schema's first
// spec.
std::optional<std::string> component_name(const Document& doc, const std::string& section,
                                          const std::string& key, Where& where) {
  where = doc.file_where();
  const kiln_option_spec& spec = core_schema(section).front();
  if (const Section* sec = doc.find(section)) {
    for (const auto& entry : sec->entries) {
      if (entry.key != key) continue;
      std::string ignored;
      const auto value = check_value(*entry.node, spec, section + "." + key, true, ignored);
      if (!value) return std::nullopt;
      where = entry.value_where;
      return value->string_value;
    }
  }
  const auto value = parse_default(spec);
  if (!value) return std::nullopt;
  return value->string_value;
}

// model.norm, when set, names the norm component behind every norm layer and wins over
// norm.name: one key (or one --set) swaps them all, as convert_sync_batchnorm does.
std::optional<std::string> swapped_norm(const Document& doc, std::optional<std::string> name,
                                        Where& name_where, std::string& name_key) {
  const Section* model = doc.find("model");
  if (model == nullptr) return name;
  for (const auto& entry : model->entries) {
    const auto* value = entry.key == "norm" ? entry.node->as_string() : nullptr;
    if (value == nullptr || value->get().empty()) continue;  // resolve_entries reports types
    name_where = entry.value_where;
    name_key = "model.norm";
    return value->get();
  }
  return name;
}

ComponentChoice component_section(const Document& doc, const std::string& section, int32_t kind,
                                  const plugin::Registry& registry, Diagnostics& diagnostics,
                                  const std::string& key = "name") {
  ComponentChoice choice;
  choice.section = section;
  const auto& core = core_schema(section);
  Where name_where;
  auto name = component_name(doc, section, key, name_where);
  std::string name_key = section + "." + key;  // the key an unknown name is reported under
  if (section == "norm") name = swapped_norm(doc, name, name_where, name_key);
  if (name) choice.component = registry.find(kind, *name);
  if (name && choice.component == nullptr) {
    std::vector<std::string> available;
    for (const auto* c : registry.of_kind(kind)) available.emplace_back(c->name());
    const auto best = nearest(*name, available);
    diagnostics.add(name_where,
                    name_key + ": unknown " + plugin::kind_name(kind) + " '" + *name + "'; " +
                        (best ? "did you mean '" + *best + "'? " : std::string()) +
                        "available: " + (available.empty() ? "(none)" : join(available)));
  }
  // The loader refused components whose options clash with the core keys or have broken
  // defaults, so the component's specs join the core ones as they are.
  std::vector<SpecRef> specs = refs(core);
  if (choice.component != nullptr) {
    const kiln_component_descriptor* d = choice.component->descriptor;
    for (std::size_t i = 0; i < d->option_count; ++i)
      specs.push_back(SpecRef{&d->options[i], true});
  }
  // [optimizer.custom_keys] is a table of rules, read by param_rules().
  const std::set<std::string> skip =
      section == "optimizer" ? std::set<std::string>{"custom_keys"} : std::set<std::string>{};
  const auto values = resolve_entries(doc, section, doc.find(section), specs,
                                      choice.component != nullptr, diagnostics, skip);
  for (const auto& [spec, value] : values) {
    // A copy of the binding: lambdas may not capture structured bindings before C++20 (clang).
    const kiln_option_spec* const resolved = spec;
    const bool is_core = std::any_of(core.begin(), core.end(),
                                     [&](const kiln_option_spec& c) { return &c == resolved; });
    (is_core ? choice.core : choice.options).set(spec->name, value);
  }
  if (choice.core.has(key)) choice.name_pos = choice.core.get(key).pos;
  return choice;
}

// Where a node inside an entry sits: its own file position, or the entry's (for overrides).
Where where_of(const Document& doc, const Entry& entry, const toml::node& node) {
  if (entry.value_where.group != 0) return entry.value_where;
  Where w = where_in_file(doc.name(), node.source());
  return w.group == 0 ? w : entry.value_where;
}

// [optimizer.custom_keys]: "<regex>" = { lr_mult = x, decay_mult = y }, in file order.
std::vector<ParamRule> param_rules(const Document& doc, Diagnostics& diagnostics) {
  std::vector<ParamRule> rules;
  const Section* sec = doc.find("optimizer");
  if (sec == nullptr) return rules;
  static const kiln_option_spec mult_specs[] = {
      {sizeof(kiln_option_spec), "lr_mult", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "1.0", nullptr,
       "learning-rate multiplier"},
      {sizeof(kiln_option_spec), "decay_mult", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "1.0", nullptr,
       "weight-decay multiplier"}};
  const std::vector<std::string> mult_names = {"lr_mult", "decay_mult"};
  for (const auto& entry : sec->entries) {
    if (entry.key != "custom_keys") continue;
    const toml::table* table = entry.node->as_table();
    if (table == nullptr) {
      diagnostics.add(entry.value_where, "optimizer.custom_keys: expected table, found " +
                                             std::string(toml_type_name(*entry.node)));
      continue;
    }
    for (const auto& [key, node] : *table) {
      const std::string pattern(key.str());
      const std::string where_name = "optimizer.custom_keys." + toml_key(pattern);
      ParamRule rule;
      rule.pattern = pattern;
      const Where rule_where = where_of(doc, entry, node);
      rule.pos = rule_where.pos;
      if (const std::string problem = regex_problem(pattern); !problem.empty()) {
        diagnostics.add(rule_where, where_name + ": " + problem);
        continue;
      }
      const toml::table* mults = node.as_table();
      if (mults == nullptr) {
        diagnostics.add(rule_where, where_name + ": expected table, found " +
                                        std::string(toml_type_name(node)));
        continue;
      }
      bool ok = true;
      for (const auto& [mkey, mnode] : *mults) {
        const std::string name(mkey.str());
        const Where at = where_of(doc, entry, mnode);
        const kiln_option_spec* spec = nullptr;
        for (const auto& s : mult_specs) spec = name == s.name ? &s : spec;
        if (spec == nullptr) {
          const auto best = nearest(name, mult_names);
          diagnostics.add(
              at, where_name + "." + name + ": unknown key; " +
                      (best ? "did you mean '" + *best + "'?" : "valid keys: lr_mult, decay_mult"));
          ok = false;
          continue;
        }
        std::string error;
        auto value = check_value(mnode, *spec, where_name + "." + name, true, error);
        if (!value) {
          diagnostics.add(at, error);
          ok = false;
          continue;
        }
        (name == "lr_mult" ? rule.lr_mult : rule.decay_mult) = value->float_value;
      }
      if (ok) rules.push_back(rule);
    }
  }
  return rules;
}

// A list of regular expressions (optimizer.freeze, model.init_skip): the engine compiles each
// pattern, so a bad one is a config error here, at the key's value.
void regex_list(const Document& doc, const std::string& section, const std::string& key,
                const ComponentChoice& choice, Diagnostics& diagnostics) {
  if (!choice.core.has(key)) return;
  Where where = doc.file_where();
  if (const Section* sec = doc.find(section)) {
    for (const auto& entry : sec->entries) {
      if (entry.key == key) where = entry.value_where;
    }
  }
  const auto& patterns = choice.core.get_string_list(key);
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    if (const std::string problem = regex_problem(patterns[i]); !problem.empty()) {
      diagnostics.add(where, section + "." + key + "[" + std::to_string(i) + "]: " + problem);
    }
  }
}

Pipeline resolve(const Document& doc, const plugin::Registry& registry, Diagnostics& diagnostics) {
  const auto& sections = core_sections();
  for (const auto& s : doc.sections()) {
    if (std::find(sections.begin(), sections.end(), s.name) != sections.end()) continue;
    const auto best = nearest(s.name, sections);
    diagnostics.add(s.where, s.name + ": unknown section; " +
                                 (best ? "did you mean '" + *best + "'?"
                                       : "valid sections: " + join(sections)));
  }
  Pipeline p;
  p.path = doc.name();
  for (const auto& s : doc.sections()) p.table_pos[s.name] = s.where.pos;
  p.run = plain_section(doc, "run", diagnostics);
  p.dataset =
      component_section(doc, "data", KILN_COMPONENT_DATASET, registry, diagnostics, "dataset");
  p.data = p.dataset.core;
  p.model = component_section(doc, "model", KILN_COMPONENT_MODEL, registry, diagnostics);
  regex_list(doc, "model", "init_skip", p.model, diagnostics);
  p.norm = component_section(doc, "norm", KILN_COMPONENT_NORM, registry, diagnostics);
  p.optimizer =
      component_section(doc, "optimizer", KILN_COMPONENT_OPTIMIZER, registry, diagnostics);
  regex_list(doc, "optimizer", "freeze", p.optimizer, diagnostics);
  p.lr_policy =
      component_section(doc, "lr_policy", KILN_COMPONENT_LR_POLICY, registry, diagnostics);
  p.param_rules = param_rules(doc, diagnostics);
  p.lr_scaling = plain_section(doc, "lr_scaling", diagnostics);
  p.precision =
      component_section(doc, "precision", KILN_COMPONENT_PRECISION, registry, diagnostics);
  p.dist = plain_section(doc, "dist", diagnostics);
  p.memory = plain_section(doc, "memory", diagnostics);
  p.loss = plain_section(doc, "loss", diagnostics);
  p.ema = plain_section(doc, "ema", diagnostics);
  const OptionSet plugins = plain_section(doc, "plugins", diagnostics);
  if (plugins.has("paths")) p.plugin_paths = plugins.get_string_list("paths");
  diagnostics.throw_if_any();
  p.settings = read_settings(p);
  return p;
}

void emit(std::string& out, const OptionSet& set) {
  for (const auto& [name, value] : set.entries()) {
    out += toml_key(name) + " = " + value.to_toml() + "\n";
  }
}

}  // namespace

std::vector<std::string> read_plugin_paths(const std::string& path,
                                           const std::vector<std::string>& overrides) {
  return read_plugin_paths_text(read_file(path), path, overrides);
}

std::vector<std::string> read_plugin_paths_text(const std::string& text, const std::string& name,
                                                const std::vector<std::string>& overrides) {
  Document doc(text, name);
  Diagnostics diagnostics;
  doc.apply_overrides(overrides, diagnostics, "plugins");
  const auto values = resolve_entries(doc, "plugins", doc.find("plugins"),
                                      refs(core_schema("plugins")), true, diagnostics);
  diagnostics.throw_if_any();
  for (const auto& [spec, value] : values) {
    if (std::strcmp(spec->name, "paths") == 0) return value.string_list;
  }
  return {};
}

Pipeline load_pipeline(const std::string& path, const std::vector<std::string>& overrides,
                       const plugin::Registry& registry) {
  return load_pipeline_text(read_file(path), path, overrides, registry);
}

Pipeline load_pipeline_text(const std::string& text, const std::string& name,
                            const std::vector<std::string>& overrides,
                            const plugin::Registry& registry) {
  Document doc(text, name);
  Diagnostics diagnostics;
  doc.apply_overrides(overrides, diagnostics);
  return resolve(doc, registry, diagnostics);
}

std::string to_toml(const Pipeline& pipeline) {
  std::string out = "# Resolved pipeline " + pipeline.path + ", every default filled.\n";
  const auto plain = [&](const char* section, const OptionSet& set) {
    out += std::string("\n[") + section + "]\n";
    emit(out, set);
  };
  const auto component = [&](const ComponentChoice& choice) {
    out += "\n[" + choice.section + "]\n";
    emit(out, choice.core);
    emit(out, choice.options);
  };
  plain("run", pipeline.run);
  component(pipeline.dataset);
  component(pipeline.model);
  component(pipeline.norm);
  component(pipeline.optimizer);
  if (!pipeline.param_rules.empty()) {
    out += "\n[optimizer.custom_keys]\n";
    for (const auto& rule : pipeline.param_rules) {
      out += toml_key(rule.pattern) + " = { lr_mult = " + format_toml_float(rule.lr_mult) +
             ", decay_mult = " + format_toml_float(rule.decay_mult) + " }\n";
    }
  }
  component(pipeline.lr_policy);
  plain("lr_scaling", pipeline.lr_scaling);
  component(pipeline.precision);
  plain("dist", pipeline.dist);
  plain("memory", pipeline.memory);
  plain("loss", pipeline.loss);
  plain("ema", pipeline.ema);
  Value paths;
  paths.type = KILN_OPT_STRING_LIST;
  paths.string_list = pipeline.plugin_paths;
  out += "\n[plugins]\npaths = " + paths.to_toml() + "\n";
  return out;
}

}  // namespace kiln::config
