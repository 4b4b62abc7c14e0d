#include "config/reference.hpp"

#include <algorithm>
#include <limits>

#include "config/pipeline.hpp"
#include "config/toml_text.hpp"

namespace kiln::config {
namespace {

std::string bound(double v) {
  // The schemas express "> 0" as ">= the smallest positive double".
  return format_number(v);
}

std::string range(const kiln_option_spec& s) {
  std::string out;
  const bool positive = s.has_min && s.min == std::numeric_limits<double>::denorm_min();
  if (s.has_min && s.has_max) {
    out = positive ? "> 0, <= " + bound(s.max) : "[" + bound(s.min) + ", " + bound(s.max) + "]";
  } else if (s.has_min) {
    out = positive ? "> 0" : ">= " + bound(s.min);
  } else if (s.has_max) {
    out = "<= " + bound(s.max);
  }
  if (s.choices != nullptr) {
    std::string c = s.choices;
    std::replace(c.begin(), c.end(), ',', ' ');
    out += (out.empty() ? "" : "; ") + std::string("one of: ") + c;
  }
  return out;
}

std::string cell(std::string text) {
  // A '|' would end the table cell.
  std::string out;
  for (char ch : text) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return out;
}

std::string table(const kiln_option_spec* specs, size_t count) {
  std::string out = "| key | type | default | allowed | description |\n|---|---|---|---|---|\n";
  for (size_t i = 0; i < count; ++i) {
    const kiln_option_spec& s = specs[i];
    out += "| `" + std::string(s.name) + "` | " + option_type_name(s.type) + " | " +
           (s.default_value != nullptr ? "`" + cell(s.default_value) + "`" : "required") + " | " +
           cell(range(s)) + " | " + cell(s.doc != nullptr ? s.doc : "") + " |\n";
  }
  return out;
}

std::string library_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// What a section's table alone cannot say, after it.
std::string section_note(const std::string& section) {
  std::string out;
  if (section == "optimizer") {
    out +=
        "\n`[optimizer.custom_keys]`: parameter-group rules, `\"<regular expression>\" = { "
        "lr_mult = 1.0, decay_mult = 1.0 }`. A parameter whose name the expression matches "
        "(searched, ECMAScript syntax) gets lr × lr_mult and weight decay × decay_mult; when "
        "several match, the longest matched text wins, then the longer expression. Custom "
        "keys take precedence over the bias and norm rules.\n";
    const auto& inner = core_schema("optimizer.inner");
    out +=
        "\n`[optimizer.inner]`: the optimizer a wrapper steps (an optimizer whose `kiln plugins "
        "describe` shows \"wraps an optimizer\", as `lookahead`); required by a wrapper and "
        "refused by any other. Its own options follow `name`; the wrapper's options stay in "
        "`[optimizer]`. It must step one group at a time (no wrapper, no `step_all`). Both "
        "states are checkpointed (the inner one's slots as `inner.<slot>`).\n\n" +
        table(inner.data(), inner.size());
    const auto& part = core_schema("optimizer.partition");
    out +=
        "\n`[[optimizer.partition]]`: parameters another optimizer steps (Muon on the 2-D "
        "weights, `[optimizer]`'s AdamW on the rest). Each entry names an optimizer with its "
        "own options and selects parameters by rank, name and group; a parameter goes to the "
        "first entry whose conditions all hold, else to `[optimizer]`'s. Its part of group G "
        "becomes group `G/<optimizer>` (lr and weight decay × the entry's multipliers); `kiln "
        "plan` lists which parameter goes where. An optimizer that takes the whole step "
        "(`step_all`) cannot share the parameters with partitions.\n\n" +
        table(part.data(), part.size());
  }
  if (section == "loss") {
    out +=
        "\nA model whose plugin computes its own loss (the model vtable's `loss` slot, ABI "
        "1.8) trains and evaluates with it; a `[loss]` key other than its default is then a "
        "configuration error. Evaluation reports this loss over the test split (the mean "
        "over all its samples, as one batch would give), top-1 and top-5 accuracy (top-k with "
        "k = min(5, classes)), or for multi-label data (a dataset of target rows, which "
        "needs bce_with_logits) the mean average precision instead of the accuracies; "
        "docs/loss.md.\n";
  }
  if (section == "ema") {
    out +=
        "\nThe average holds one fp32 copy of every parameter and buffer, on the model's "
        "device; an evaluation of it swaps it into the model and the trained weights back "
        "after. Checkpoints keep it (trainer.safetensors, `ema/<name>`), so a resumed run "
        "continues it; `kiln export --ema` writes it as a weights file (for model.init or "
        "`kiln evaluate --weights`). The `[ema]` keys may change on resume: the trained "
        "weights do not depend on them, and a checkpoint without an average starts one from "
        "its weights. docs/ema.md.\n";
  }
  if (section == "lr_policy") {
    out +=
        "\nIterations are optimizer steps numbered from 1: the run's first step trains at the "
        "rate of iteration 1, and a step skipped for non-finite gradients keeps its number for "
        "the next step under `count = \"applied\"`. An epoch has ceil(batches / "
        "run.accumulation_steps) iterations. Warm-up gives the rate of iterations 1..W; from "
        "W + 1 on the policy component gives it, for the same iteration number: `step`, "
        "`multistep` and `exp` count from the start of the run, warm-up included, and "
        "`cosine` and `poly` start their decay at W + 1. The rate is the base lr (optimizer.lr, "
        "times the effective batch / lr_scaling.base_batch when that is set) times each "
        "group's scale. Each component below names the reference it equals at every "
        "iteration (tests/lr/lr_reference_test.cpp checks them against PyTorch's schedulers "
        "and Pet's formulas); `kiln lr-schedule` prints the run's rates, `kiln plan` its "
        "length. PyTorch trains the k-th optimizer step at last_epoch = k - 1, so where Pet "
        "and PyTorch differ by one iteration both are here by name: `step` with `steps` is "
        "Pet's STEP (iteration s is the first decayed) and `multistep` is MultiStepLR (s + 1); "
        "warm-up `linear` is Pet's (which is LinearLR(start_factor = F + (1 - F) / W, "
        "total_iters = W - 1) for W >= 2) and `torch_linear` is LinearLR(start_factor = F, "
        "total_iters = W). Changed in 2.0 of the policies' library (libkiln_lr_schedules, "
        "named kiln_step before ABI 1.6): `multistep`, `exp` and `step` with "
        "`step_size` were one iteration ahead of the PyTorch schedulers they name; a 1.x "
        "`multistep` pipeline gets its old rates from `step` with the same list as `steps` "
        "(without repeats).\n";
  }
  return out;
}

}  // namespace

std::string reference_markdown(const plugin::Registry& registry) {
  std::string out =
      "# Configuration reference\n\n"
      "Generated by `kiln config-docs` from the options schemas of the host and of every "
      "built-in plugin; the test suite fails when this file is not current. Regenerate with\n"
      "`build/release/bin/kiln config-docs > docs/config.md`.\n\n"
      "A pipeline is one TOML file; every key below can also be set with `--set "
      "section.key=value`. Component sections (`model`, `norm`, `optimizer`, `lr_policy`, "
      "`precision`) take their core keys plus the options of the component named by `name`.\n";
  out += "\n## Sections\n";
  for (const auto& section : core_sections()) {
    const auto& specs = core_schema(section);
    out += "\n### [" + section + "]\n\n" + table(specs.data(), specs.size());
    out += section_note(section);
  }
  out += "\n## Components\n";
  for (int32_t kind :
       {KILN_COMPONENT_DATASET, KILN_COMPONENT_MODEL, KILN_COMPONENT_NORM, KILN_COMPONENT_OPTIMIZER,
        KILN_COMPONENT_LR_POLICY, KILN_COMPONENT_PRECISION}) {
    auto components = registry.of_kind(kind);
    std::sort(components.begin(), components.end(),
              [](const plugin::Component* a, const plugin::Component* b) {
                return a->name() < b->name();
              });
    for (const plugin::Component* c : components) {
      const auto* d = c->descriptor;
      out += "\n### " + std::string(plugin::kind_name(kind)) + " `" + std::string(c->name()) +
             "` " + std::to_string(d->version.major) + "." + std::to_string(d->version.minor) +
             "." + std::to_string(d->version.patch) + " (" + library_name(c->library_path) +
             ")\n\n";
      if (d->summary != nullptr) out += std::string(d->summary) + "\n\n";
      out +=
          d->option_count == 0 ? std::string("No options.\n") : table(d->options, d->option_count);
    }
  }
  return out;
}

}  // namespace kiln::config
