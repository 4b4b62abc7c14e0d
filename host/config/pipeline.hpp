// The resolved pipeline: a TOML file (plus --set overrides) checked against the core schema and
// against each chosen component's options schema, with defaults filled.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "config/options.hpp"
#include "config/settings.hpp"
#include "plugin/registry.hpp"

namespace kiln::config {

// A parameter-group rule from [optimizer.custom_keys]: parameters whose name the regular
// expression `pattern` matches get lr × lr_mult and weight decay × decay_mult.
struct ParamRule {
  std::string pattern;  // ECMAScript regular expression, searched in the parameter name
  double lr_mult = 1.0;
  double decay_mult = 1.0;
  SourcePos pos;  // where the rule was written
};

// The component chosen for one slot of the pipeline ("optimizer", "model", ...).
struct ComponentChoice {
  std::string section;                           // TOML table name
  const plugin::Component* component = nullptr;  // from the registry
  OptionSet core;                                // the section's core keys (e.g. optimizer.lr)
  OptionSet options;                             // the component's own options
  SourcePos name_pos;                            // where `name` (data.dataset) was set
};

// [[optimizer.partition]]: parameters another optimizer steps. A parameter goes to the first
// entry whose conditions all hold, else to [optimizer]'s optimizer.
struct OptimizerPartition {
  ComponentChoice optimizer;  // section "optimizer.partition[<i>]"; core: the keys below
  int64_t min_rank = 0;
  int64_t max_rank = -1;            // -1: no bound
  std::string match;                // regular expression; "" = any
  std::string exclude;              // regular expression; "" = none
  std::vector<std::string> groups;  // parameter-group names; empty = any
  double lr_mult = 1.0;
  double decay_mult = 1.0;
  SourcePos pos;  // the entry's table
};

struct Pipeline {
  std::string path;                    // the TOML file
  OptionSet run;                       // [run]
  OptionSet data;                      // [data]: the host's keys (dataset.core)
  ComponentChoice dataset;             // [data]: data.dataset and its options
  ComponentChoice model;               // [model]
  ComponentChoice norm;                // [norm]
  ComponentChoice optimizer;           // [optimizer]
  ComponentChoice lr_policy;           // [lr_policy]
  ComponentChoice precision;           // [precision]
  OptionSet lr_scaling;                // [lr_scaling]
  OptionSet dist;                      // [dist]: data-parallel settings
  OptionSet memory;                    // [memory]: activation checkpointing
  OptionSet loss;                      // [loss]: the training and evaluation loss
  OptionSet ema;                       // [ema]: the weights' moving average
  std::vector<ParamRule> param_rules;  // [optimizer.custom_keys], in file order
  // [optimizer.inner]: the optimizer a wrapper steps (component null when there is none)
  ComponentChoice inner_optimizer;
  std::vector<OptimizerPartition> partitions;  // [[optimizer.partition]], in file order
  std::vector<std::string> plugin_paths;       // [plugins] paths: extra plugin folders
  std::map<std::string, SourcePos> table_pos;  // where each [section] the file has begins
  Settings settings;                           // the host's keys above, typed
};

// Extra plugin folders named in the file's [plugins] table (read before the registry is built,
// so pipelines can bring their own plugins). Throws ConfigError.
std::vector<std::string> read_plugin_paths(const std::string& path,
                                           const std::vector<std::string>& overrides);
// The same from TOML text (`name` is used in messages as the file name).
std::vector<std::string> read_plugin_paths_text(const std::string& text, const std::string& name,
                                                const std::vector<std::string>& overrides);

// Loads, overrides and validates. `overrides` are "dotted.key=value" strings (value parsed as a
// TOML value, falling back to a bare string). Throws ConfigError with file:line:column and key.
Pipeline load_pipeline(const std::string& path, const std::vector<std::string>& overrides,
                       const plugin::Registry& registry);

// The same from TOML text (`name` is used in messages as the file name).
Pipeline load_pipeline_text(const std::string& text, const std::string& name,
                            const std::vector<std::string>& overrides,
                            const plugin::Registry& registry);

// The core schema of each section, as option specs (the same shape plugins use), for docs and
// `kiln plan`. Sections: run, data, model, norm, optimizer, lr_policy, lr_scaling, precision,
// dist, memory, loss, ema, plugins.
const std::vector<kiln_option_spec>& core_schema(const std::string& section);
const std::vector<std::string>& core_sections();

// The resolved pipeline as TOML text with every default filled (for `kiln plan`).
std::string to_toml(const Pipeline& pipeline);

}  // namespace kiln::config
