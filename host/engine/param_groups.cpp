#include "engine/param_groups.hpp"

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
    groups.push_back(ParamGroup{name, lr_scale, wd, {}, {}});
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
  return out;
}

}  // namespace kiln::engine
