#include "engine/model_build.hpp"

#include "engine/checks.hpp"
#include "engine/init_weights.hpp"
#include "engine/run_data.hpp"
#include "kiln/torch.hpp"
#include "plugin/adapters.hpp"
#include "plugin/norm_layer.hpp"
#include "plugin/norm_window.hpp"

namespace kiln::engine {
namespace {

// The key by which the pipeline chose its norm explicitly, or "": a norm component other than
// the default (norm.name, or model.norm that swapped it), else the first [norm] key set to
// other than its default.
std::string explicit_norm_key(const config::Pipeline& p) {
  const config::ComponentChoice& norm = p.norm;
  std::string default_name;
  for (const kiln_option_spec& spec : config::core_schema("norm")) {
    if (std::string(spec.name) == "name" && spec.default_value != nullptr) {
      default_name = spec.default_value;  // a TOML literal: "\"batchnorm\""
    }
  }
  if (norm.component != nullptr &&
      "\"" + std::string(norm.component->name()) + "\"" != default_name) {
    return p.settings.model.norm.empty() ? "norm.name" : "model.norm";
  }
  for (const config::OptionSet* table : {&norm.core, &norm.options}) {
    for (const auto& [key, value] : table->entries()) {
      if (key != "name" && !value.is_default) return "norm." + key;
    }
  }
  return "";
}

}  // namespace

std::shared_ptr<kiln::Model> build_model(const config::Pipeline& p, const kiln_model_input& input,
                                         c10::DeviceType device, int32_t world_size,
                                         std::shared_ptr<plugin::NormWindow> window,
                                         dist::ProcessGroup* group) {
  // Reached only through this model's create call (its context), so runs built side by side
  // never take each other's norm plugin.
  int64_t layers = 0;
  const plugin::NormFactory norms = [&](const kiln_norm_request& request) {
    ++layers;
    return std::make_shared<plugin::PluginNormLayer>(*p.norm.component, p.norm.options, request,
                                                     world_size, window, group, device);
  };
  std::shared_ptr<kiln::Model> model =
      plugin::create_model(*p.model.component, p.model.options, input, &norms);
  // A [norm] choice that reaches no layer would be ignored in silence (a scripted model's batch
  // norm is its own, an mlp without norm_layers has none): say so before the run.
  if (layers == 0) {
    if (const std::string key = explicit_norm_key(p); !key.empty()) {
      throw PipelineError(key, "model '" + std::string(p.model.component->name()) +
                                   "' builds no norm layers through the host, so the pipeline's "
                                   "norm settings would not apply; remove them (its own layers, "
                                   "if any, are part of the model)");
    }
  }
  return model;
}

void load_initial_weights(const config::Pipeline& p, kiln::Model& model) {
  const std::string& init = p.settings.model.init;
  if (init.empty()) return;
  try {
    (void)load_weights(model, init, p.settings.model.init_skip);
  } catch (const std::exception& e) {
    throw PipelineError("model.init", e.what());
  }
}

std::shared_ptr<plugin::NormWindow> norm_window_for(const config::Pipeline& p) {
  const plugin::RunningStatsUpdate mode =
      plugin::parse_running_stats_update(p.settings.norm.running_stats_update);
  if (p.settings.run.accumulation_steps <= 1 || mode == plugin::RunningStatsUpdate::kMicroBatch) {
    return nullptr;
  }
  return std::make_shared<plugin::NormWindow>(mode);
}

kiln_model_input described_input(const config::Pipeline& p) {
  // The training split's batches as the loader shapes them (crops included).
  const std::shared_ptr<const data::Source> train = open_train_split(p);
  const auto shape = train_sample_shape(p.settings.data, *train);
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  input.channels = shape[0];
  input.height = shape[1];
  input.width = shape[2];
  input.num_classes = train->num_classes();
  return input;
}

}  // namespace kiln::engine
