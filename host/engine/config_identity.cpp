#include "engine/config_identity.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "config/locate.hpp"
#include "config/value_check.hpp"
#include "io/crc.hpp"

namespace kiln::engine {
namespace {

// Keys that do not change what training computes: changing them keeps checkpoints usable.
const std::set<std::string> kFreeRunKeys = {
    "epochs",          "max_steps",       "log_interval",        "eval",
    "threads",         "output_dir",      "checkpoint_every",    "checkpoint_keep",
    "resume_fallback", "tensorboard",     "max_nonfinite_steps", "profile_steps",
    "profile_start",   "checkpoint_best", "early_stop_patience"};
const std::set<std::string> kFreeDataKeys = {
    "workers", "prefetch", "eval_batch_size", "synthetic_cache_mib", "root", "val_root"};
// Whole sections the trained weights do not depend on: what is recomputed, what is averaged.
// Neither was ever hashed, so checkpoints keep their hash.
const std::set<std::string> kFreeSections = {"[memory]", "[ema]"};

// Splits a `key = value` line of config::to_toml's output after its key, which may be quoted
// (and then hold " = " itself).
std::pair<std::string, std::string> split_entry(const std::string& line) {
  size_t from = 0;
  if (!line.empty() && line[0] == '"') {
    for (from = 1; from < line.size() && line[from] != '"'; ++from) {
      if (line[from] == '\\') ++from;
    }
  }
  const size_t at = line.find(" = ", from);
  if (at == std::string::npos) return {line, ""};
  return {line.substr(0, at), line.substr(at + 3)};
}

// Whether a `key = value` line of to_toml's [loss] is that key's default.
bool default_loss_line(const std::string& line) {
  auto [name, value] = split_entry(line);
  for (const kiln_option_spec& spec : config::core_schema("loss")) {
    if (name != spec.name) continue;
    const auto defaults = config::parse_default(spec);
    return defaults && defaults->to_toml() == value;
  }
  return false;
}

// The resolved pipeline's lines that the identity covers, with their keys: one pass for both
// the hash (over the lines, as checkpoints have always been hashed) and the keys.
struct IdentityLines {
  std::string hashed;  // the lines the hash covers, each with its newline
  ConfigKeys keys;
};

IdentityLines identity_lines(const config::Pipeline& p) {
  IdentityLines out;
  std::istringstream text(config::to_toml(p));
  std::string line, section;
  while (std::getline(text, line)) {
    if (!line.empty() && line[0] == '[') {
      section = line;
      // [loss] came with ABI 1.8: its defaults are what every earlier checkpoint trained with,
      // so only keys set otherwise join the identity, and those checkpoints keep their hash.
      if (section == "[loss]" || kFreeSections.count(section)) continue;
    } else if (kFreeSections.count(section)) {
      continue;
    } else if (section == "[loss]") {
      if (line.empty() || default_loss_line(line)) continue;
      auto [name, value] = split_entry(line);
      out.keys["loss." + name] = value;
      out.hashed += "loss." + line + "\n";
      continue;
    } else {
      const std::string key = line.substr(0, line.find_first_of(" ="));
      if (section == "[run]" && kFreeRunKeys.count(key)) continue;
      if (section == "[data]" && kFreeDataKeys.count(key)) continue;
      if (section == "[plugins]") continue;
      if (!section.empty() && !line.empty()) {
        auto [name, value] = split_entry(line);
        out.keys[section.substr(1, section.size() - 2) + "." + name] = std::move(value);
      }
    }
    out.hashed += line + "\n";
  }
  return out;
}

}  // namespace

ConfigKeys config_identity(const config::Pipeline& p) { return identity_lines(p).keys; }

std::string config_hash(const config::Pipeline& p) {
  const std::string kept = identity_lines(p).hashed;
  return fmt::format("crc32:{:08x}", io::crc_of<io::Crc32>(kept.data(), kept.size()));
}

ConfigKeys identity_defaults(const config::Pipeline& p) {
  ConfigKeys out;
  for (const auto& [key, value] : config_identity(p)) {
    const size_t dot = key.find('.');
    const std::string section = key.substr(0, dot), name = key.substr(dot + 1);
    std::vector<const kiln_option_spec*> specs;
    const auto& sections = config::core_sections();
    if (std::find(sections.begin(), sections.end(), section) != sections.end()) {
      for (const kiln_option_spec& spec : config::core_schema(section)) specs.push_back(&spec);
    }
    const config::ComponentChoice* choice = config::choice_of(p, section);
    if (section == "data") choice = &p.dataset;
    if (choice != nullptr && choice->component != nullptr) {
      const kiln_component_descriptor* d = choice->component->descriptor;
      for (size_t i = 0; i < d->option_count; ++i) specs.push_back(&d->options[i]);
    }
    for (const kiln_option_spec* spec : specs) {
      if (name != spec->name) continue;
      if (const auto v = config::parse_default(*spec)) out[key] = v->to_toml();
      break;
    }
  }
  return out;
}

std::string config_difference(const ConfigKeys& checkpoint, const ConfigKeys& here,
                              const ConfigKeys& defaults) {
  std::vector<std::string> differ;
  std::set<std::string> keys;
  for (const auto& [key, value] : checkpoint) keys.insert(key);
  for (const auto& [key, value] : here) keys.insert(key);
  for (const std::string& key : keys) {
    const auto then = checkpoint.find(key);
    const auto now = here.find(key);
    if (then == checkpoint.end()) {
      const auto fallback = defaults.find(key);
      if (fallback != defaults.end() && fallback->second == now->second) continue;
      differ.push_back(fmt::format("{} = {} here, not in the checkpoint", key, now->second));
    } else if (now == here.end()) {
      differ.push_back(fmt::format("{} = {} in the checkpoint, not here", key, then->second));
    } else if (then->second != now->second) {
      differ.push_back(
          fmt::format("{} = {} here, {} in the checkpoint", key, now->second, then->second));
    }
  }
  return fmt::format("{}", fmt::join(differ, "; "));
}

std::string keys_free_on_resume() {
  std::vector<std::string> keys;
  for (const std::string& key : kFreeRunKeys) keys.push_back("run." + key);
  for (const std::string& key : kFreeDataKeys) keys.push_back("data." + key);
  keys.emplace_back("plugins.paths");
  keys.emplace_back("memory.checkpoint");
  keys.emplace_back("ema.*");
  return fmt::format("{}", fmt::join(keys, ", "));
}

}  // namespace kiln::engine
