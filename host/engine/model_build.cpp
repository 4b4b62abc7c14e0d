#include "engine/model_build.hpp"

#include "kiln/torch.hpp"
#include "plugin/adapters.hpp"
#include "plugin/host_api.hpp"
#include "plugin/norm_layer.hpp"

namespace kiln::engine {

std::shared_ptr<kiln::Model> build_model(const config::Pipeline& p, const kiln_model_input& input,
                                         int32_t world_size) {
  plugin::set_norm_factory([&](const kiln_norm_request& request) {
    return std::make_shared<plugin::PluginNormLayer>(*p.norm.component, p.norm.options, request,
                                                     world_size);
  });
  try {
    std::shared_ptr<kiln::Model> model =
        plugin::create_model(*p.model.component, p.model.options, input);
    plugin::set_norm_factory(nullptr);
    return model;
  } catch (...) {
    plugin::set_norm_factory(nullptr);
    throw;
  }
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
