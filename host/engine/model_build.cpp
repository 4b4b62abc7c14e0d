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
      plugin::parse_running_stats_update(p.norm.core.get_string("running_stats_update"));
  if (p.run.get_int("accumulation_steps") <= 1 || mode == plugin::RunningStatsUpdate::kMicroBatch) {
    return nullptr;
  }
  return std::make_shared<plugin::NormWindow>(mode);
}

kiln_model_input described_input(const config::Pipeline& p) {
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  const bool synthetic = p.data.get_string("dataset") == "synthetic";
  input.channels = synthetic ? p.data.get_int("channels") : 1;
  input.height = synthetic ? p.data.get_int("height") : 28;
  input.width = synthetic ? p.data.get_int("width") : 28;
  input.num_classes = synthetic ? p.data.get_int("synthetic_classes") : 10;
  return input;
}

}  // namespace kiln::engine
