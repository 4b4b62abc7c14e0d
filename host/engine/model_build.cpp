#include "engine/model_build.hpp"

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
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  const config::DataSettings& d = p.settings.data;
  const bool synthetic = d.dataset == "synthetic";
  input.channels = synthetic ? d.channels : 1;
  input.height = synthetic ? d.height : 28;
  input.width = synthetic ? d.width : 28;
  input.num_classes = synthetic ? d.synthetic_classes : 10;
  return input;
}

}  // namespace kiln::engine
