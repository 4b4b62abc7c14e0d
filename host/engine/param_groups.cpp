#include "engine/param_groups.hpp"

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>

#include "kiln/torch.hpp"

namespace kiln::engine {

GroupRules group_rules(const config::Pipeline& p) {
  const config::OptimizerSettings& o = p.settings.optimizer;
  GroupRules r;
  r.weight_decay = o.weight_decay;
  r.bias_lr_mult = o.bias_lr_mult * (o.bias_double_lr ? 2.0 : 1.0);
  r.bias_decay_mult = o.bias_weight_decay ? o.bias_decay_mult : 0.0;
  r.norm_weight_decay =
      std::isnan(o.weight_decay_norm) ? r.weight_decay * o.norm_decay_mult : o.weight_decay_norm;
  r.custom = p.param_rules;
  r.freeze = o.freeze;
  r.partitions = p.partitions;
  r.optimizer_names.emplace_back(p.optimizer.component ? p.optimizer.component->name() : "");
  for (const auto& part : p.partitions) {
    r.optimizer_names.emplace_back(part.optimizer.component ? part.optimizer.component->name()
                                                            : "");
  }
  return r;
}

namespace {

// Names of the parameters that belong to norm layers: the pipeline's, and a model's own.
std::set<std::string> norm_parameter_names(torch::nn::Module& model) {
  std::set<std::string> names;
  // include_self = false: the top-level module may not live in a shared_ptr, and is never a
  // norm layer the host built.
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    const torch::nn::Module* m = item.value().get();
    if (dynamic_cast<const kiln::NormLayer*>(m) == nullptr &&
        dynamic_cast<const kiln::NormParameters*>(m) == nullptr) {
      continue;
    }
    for (const auto& param : item.value()->named_parameters(/*recurse=*/false)) {
      names.insert(item.key().empty() ? param.key() : item.key() + "." + param.key());
    }
  }
  return names;
}

bool is_bias(const std::string& name) {
  return name == "bias" || (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0);
}

// Which optimizer steps `param` of `group`: the first partition whose conditions all hold
// (1-based), else 0.
class PartitionRules {
 public:
  explicit PartitionRules(const std::vector<config::OptimizerPartition>& parts) : parts_(parts) {
    for (const auto& part : parts) {
      match_.emplace_back(part.match.empty() ? std::string(".*") : part.match);
      exclude_.emplace_back(part.exclude.empty() ? std::string("$^") : part.exclude);
    }
  }
  size_t pick(const std::string& name, const at::Tensor& param, const std::string& group) const {
    for (size_t k = 0; k < parts_.size(); ++k) {
      const config::OptimizerPartition& part = parts_[k];
      const int64_t rank = param.dim();
      if (rank < part.min_rank || (part.max_rank >= 0 && rank > part.max_rank)) continue;
      if (!part.groups.empty() &&
          std::find(part.groups.begin(), part.groups.end(), group) == part.groups.end()) {
        continue;
      }
      if (!part.match.empty() && !std::regex_search(name, match_[k])) continue;
      if (!part.exclude.empty() && std::regex_search(name, exclude_[k])) continue;
      return k + 1;
    }
    return 0;
  }

 private:
  const std::vector<config::OptimizerPartition>& parts_;
  std::vector<std::regex> match_, exclude_;
};

// Moves the parameters partitions select out of their groups into "<group>/<optimizer>"
// groups (lr and decay multiplied by the partition's), after all of [optimizer]'s.
std::vector<ParamGroup> partition(std::vector<ParamGroup> groups, const GroupRules& rules) {
  if (rules.partitions.empty()) return groups;
  const PartitionRules pick(rules.partitions);
  std::vector<ParamGroup> main, parts;
  for (ParamGroup& g : groups) {
    ParamGroup kept{g.name, g.lr_scale, g.weight_decay, {}, {}, 0};
    std::vector<ParamGroup> split(rules.partitions.size());
    for (size_t i = 0; i < g.params.size(); ++i) {
      const size_t k = pick.pick(g.names[i], g.params[i], g.name);
      ParamGroup& to = k == 0 ? kept : split[k - 1];
      to.params.push_back(g.params[i]);
      to.names.push_back(g.names[i]);
    }
    if (!kept.params.empty()) main.push_back(std::move(kept));
    for (size_t k = 0; k < split.size(); ++k) {
      if (split[k].params.empty()) continue;
      const config::OptimizerPartition& part = rules.partitions[k];
      const std::string& optimizer = rules.optimizer_names.at(k + 1);
      // Two partitions of one optimizer would give two groups one name: number them.
      const bool shared =
          std::count(rules.optimizer_names.begin() + 1, rules.optimizer_names.end(), optimizer) > 1;
      split[k].name =
          g.name + "/" + optimizer + (shared ? "[" + std::to_string(k) + "]" : std::string());
      split[k].lr_scale = g.lr_scale * part.lr_mult;
      split[k].weight_decay = g.weight_decay * part.decay_mult;
      split[k].optimizer = k + 1;
      parts.push_back(std::move(split[k]));
    }
  }
  for (ParamGroup& g : parts) main.push_back(std::move(g));
  return main;
}

}  // namespace

std::vector<ParamGroup> build_param_groups(torch::nn::Module& model, const GroupRules& rules) {
  std::vector<std::regex> freeze;
  for (const auto& pattern : rules.freeze) freeze.emplace_back(pattern);
  std::vector<std::regex> custom;
  for (const auto& rule : rules.custom) custom.emplace_back(rule.pattern);
  const std::set<std::string> norm = norm_parameter_names(model);

  std::vector<ParamGroup> groups(1);
  groups[0].name = "default";
  groups[0].weight_decay = rules.weight_decay;
  auto group_for = [&](const std::string& name, double lr_scale, double wd) -> ParamGroup& {
    for (auto& g : groups) {
      if (g.name == name) return g;
    }
    groups.push_back(ParamGroup{name, lr_scale, wd, {}, {}, 0});
    return groups.back();
  };

  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor param = item.value();
    bool frozen = !param.requires_grad();
    for (const auto& re : freeze) frozen = frozen || std::regex_search(name, re);
    if (frozen) {
      param.set_requires_grad(false);
      continue;
    }
    // The custom rule whose match is longest (then the longer pattern, then the first).
    const config::ParamRule* best = nullptr;
    size_t best_length = 0;
    for (size_t i = 0; i < custom.size(); ++i) {
      std::smatch m;
      if (!std::regex_search(name, m, custom[i])) continue;
      const size_t length = static_cast<size_t>(m.length(0));
      if (best == nullptr || length > best_length ||
          (length == best_length && rules.custom[i].pattern.size() > best->pattern.size())) {
        best = &rules.custom[i];
        best_length = length;
      }
    }
    ParamGroup* group = nullptr;
    if (best != nullptr) {
      group = &group_for("custom_keys[\"" + best->pattern + "\"]", best->lr_mult,
                         rules.weight_decay * best->decay_mult);
    } else if (norm.count(name) != 0) {
      group = &group_for("norm", 1.0, rules.norm_weight_decay);
    } else if (is_bias(name)) {
      group = &group_for("bias", rules.bias_lr_mult, rules.weight_decay * rules.bias_decay_mult);
    } else {
      group = &groups[0];
    }
    group->params.push_back(param);
    group->names.push_back(name);
  }
  std::vector<ParamGroup> out;
  for (auto& g : groups) {
    if (!g.params.empty()) out.push_back(std::move(g));
  }
  return partition(std::move(out), rules);
}

}  // namespace kiln::engine
