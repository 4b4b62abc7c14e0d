#include "engine/model_build.hpp"

#include "engine/run_data.hpp"
#include "kiln/torch.hpp"
#include "plugin/adapters.hpp"
#include "plugin/norm_layer.hpp"
#include "plugin/norm_window.hpp"

namespace kiln::engine {

std::shared_ptr<kiln::Model> build_model(const config::Pipeline& p, const kiln_model_input& input,
                                         int32_t world_size,
                                         std::shared_ptr<plugin::NormWindow> window,
                                         dist::ProcessGroup* group) {
  // Reached only through this model's create call (its context), so runs built side by side
  // never take each other's norm plugin.
  const plugin::NormFactory norms = [&](const kiln_norm_request& request) {
    return std::make_shared<plugin::PluginNormLayer>(*p.norm.component, p.norm.options, request,
                                                     world_size, window, group);
  };
  return plugin::create_model(*p.model.component, p.model.options, input, &norms);
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
