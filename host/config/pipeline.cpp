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
std::optional<std::string> component_name(const Document& doc, const Section* sec,
                                          const std::string& section, const kiln_option_spec& spec,
                                          const std::string& key, Where& where) {
  where = sec != nullptr && sec->node != nullptr ? sec->where : doc.file_where();
  if (sec != nullptr) {
    for (const auto& entry : sec->entries) {
      if (entry.key != key) continue;
      std::string ignored;
      const auto value = check_value(*entry.node, spec, section + "." + key, true, ignored);
      if (!value) return std::nullopt;
      where = entry.value_where;
      return value->string_value;
    }
  }
  if (spec.default_value == nullptr) return std::nullopt;  // required: resolve_entries reports it
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

// A component's section: [section] of the file, or `given` (a table inside one, as
// [optimizer.inner]) checked against the core keys of `schema` (default: `section`'s).
ComponentChoice component_section(const Document& doc, const std::string& section, int32_t kind,
                                  const plugin::Registry& registry, Diagnostics& diagnostics,
                                  const std::string& key = "name", const Section* given = nullptr,
                                  const std::string& schema = "") {
  ComponentChoice choice;
  choice.section = section;
  const auto& core = core_schema(schema.empty() ? section : schema);
  const Section* sec = given != nullptr ? given : doc.find(section);
  Where name_where;
  auto name = component_name(doc, sec, section, core.front(), key, name_where);
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
  // [optimizer.custom_keys], [optimizer.inner] and [[optimizer.partition]] have readers of
  // their own (param_rules, optimizer_tables).
  const std::set<std::string> skip =
      section == "optimizer" ? std::set<std::string>{"custom_keys", "inner", "partition"}
                             : std::set<std::string>{};
  const auto values =
      resolve_entries(doc, section, sec, specs, choice.component != nullptr, diagnostics, skip);
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

// A table inside [optimizer] as a section of its own, named `name` in messages.
Section sub_section(const Document& doc, const Entry& entry, const toml::node& node,
                    const std::string& name) {
  Section sec;
  sec.name = name;
  sec.where = where_of(doc, entry, node);
  sec.node = &node;
  if (const toml::table* table = node.as_table()) {
    for (const auto& [key, value] : *table) {
      Entry e;
      e.key = std::string(key.str());
      e.node = &value;
      Where at = where_in_file(doc.name(), key.source());
      e.key_where = at.group == 0 ? at : sec.where;
      e.value_where = where_of(doc, entry, value);
      sec.entries.push_back(std::move(e));
    }
  }
  return sec;
}

// [optimizer.inner] and [[optimizer.partition]]: the optimizer a wrapper steps, and the
// parameters other optimizers step, each a component section with its own options.
void optimizer_tables(const Document& doc, const plugin::Registry& registry, Pipeline& p,
                      Diagnostics& diagnostics) {
  const Section* sec = doc.find("optimizer");
  if (sec == nullptr) return;
  for (const auto& entry : sec->entries) {
    if (entry.key == "inner") {
      const Section inner = sub_section(doc, entry, *entry.node, "optimizer.inner");
      p.inner_optimizer = component_section(doc, "optimizer.inner", KILN_COMPONENT_OPTIMIZER,
                                            registry, diagnostics, "name", &inner);
      p.table_pos["optimizer.inner"] = inner.where.pos;
      continue;
    }
    if (entry.key != "partition") continue;
    const toml::array* list = entry.node->as_array();
    if (list == nullptr) {
      diagnostics.add(entry.value_where,
                      "optimizer.partition: expected an array of tables ([[optimizer.partition]]), "
                      "found " +
                          std::string(toml_type_name(*entry.node)));
      continue;
    }
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string name = "optimizer.partition[" + std::to_string(i) + "]";
      const Section part = sub_section(doc, entry, *list->get(i), name);
      OptimizerPartition out;
      out.pos = part.where.pos;
      out.optimizer = component_section(doc, name, KILN_COMPONENT_OPTIMIZER, registry, diagnostics,
                                        "name", &part, "optimizer.partition");
      const OptionSet& core = out.optimizer.core;
      if (core.has("min_rank")) out.min_rank = core.get("min_rank").int_value;
      if (core.has("max_rank")) out.max_rank = core.get("max_rank").int_value;
      if (core.has("match")) out.match = core.get("match").string_value;
      if (core.has("exclude")) out.exclude = core.get("exclude").string_value;
      if (core.has("groups")) out.groups = core.get_string_list("groups");
      if (core.has("lr_mult")) out.lr_mult = core.get("lr_mult").float_value;
      if (core.has("decay_mult")) out.decay_mult = core.get("decay_mult").float_value;
      for (const char* key : {"match", "exclude"}) {
        if (!core.has(key)) continue;
        if (const std::string problem = regex_problem(core.get(key).string_value);
            !core.get(key).string_value.empty() && !problem.empty()) {
          diagnostics.add(part.where, name + "." + key + ": " + problem);
        }
      }
      p.partitions.push_back(std::move(out));
    }
  }
}

// What the optimizers' capabilities ask of those tables: a wrapper needs [optimizer.inner] and
// only a wrapper takes one; an inner or partition optimizer steps one group at a time.
void check_optimizer_tables(const Document& doc, const Pipeline& p, Diagnostics& diagnostics) {
  const plugin::Component* main = p.optimizer.component;
  const plugin::Component* inner = p.inner_optimizer.component;
  const auto at = [&](const SourcePos& pos, const std::string& fallback_section) {
    Where w = doc.file_where();
    if (const Section* sec = doc.find(fallback_section)) w = sec->where;
    if (!pos.file.empty() && pos.file != "<default>") {
      w.pos = pos;
      w.prefix = pos.text();
      w.group = pos.line > 0 ? 0 : 2;
      w.major = pos.line;
      w.minor = pos.column;
    }
    return w;
  };
  if (main != nullptr && plugin::wraps_optimizer(*main) && inner == nullptr &&
      p.inner_optimizer.section.empty()) {
    diagnostics.add(at(p.optimizer.name_pos, "optimizer"),
                    "optimizer.name: '" + std::string(main->name()) +
                        "' steps another optimizer: name it in [optimizer.inner] (name = \"sgd\", "
                        "and its options)");
  }
  if (main != nullptr && !plugin::wraps_optimizer(*main) && !p.inner_optimizer.section.empty()) {
    diagnostics.add(at(p.inner_optimizer.name_pos, "optimizer"),
                    "optimizer.inner: optimizer '" + std::string(main->name()) +
                        "' does not wrap another optimizer (wrappers: `kiln plugins describe` "
                        "shows \"wraps an optimizer\"); remove [optimizer.inner]");
  }
  const auto one_group_at_a_time = [&](const plugin::Component* c, const ComponentChoice& choice,
                                       const std::string& key) {
    if (c == nullptr) return;
    std::string why;
    if (plugin::wraps_optimizer(*c)) why = "wraps another optimizer";
    if (plugin::steps_all_groups(*c)) why = "takes the whole step at once (step_all)";
    if (why.empty()) return;
    diagnostics.add(at(choice.name_pos, "optimizer"),
                    key + ".name: optimizer '" + std::string(c->name()) + "' " + why +
                        "; here only an optimizer that steps one group at a time can serve");
  };
  one_group_at_a_time(inner, p.inner_optimizer, "optimizer.inner");
  if (main != nullptr && plugin::steps_all_groups(*main) && !p.partitions.empty()) {
    diagnostics.add(at(p.partitions.front().pos, "optimizer"),
                    "optimizer.partition: optimizer '" + std::string(main->name()) +
                        "' takes the whole step (and may evaluate the model again), so it must "
                        "step every parameter; remove [[optimizer.partition]]");
  }
  for (const OptimizerPartition& part : p.partitions) {
    one_group_at_a_time(part.optimizer.component, part.optimizer, part.optimizer.section);
  }
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
  optimizer_tables(doc, registry, p, diagnostics);
  check_optimizer_tables(doc, p, diagnostics);
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
  if (pipeline.inner_optimizer.component != nullptr) {
    out += "\n[optimizer.inner]\n";
    emit(out, pipeline.inner_optimizer.core);
    emit(out, pipeline.inner_optimizer.options);
  }
  for (const OptimizerPartition& part : pipeline.partitions) {
    out += "\n[[optimizer.partition]]\n";
    emit(out, part.optimizer.core);
    emit(out, part.optimizer.options);
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
