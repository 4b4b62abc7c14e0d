#include "plugin_models.hpp"

#include "config_values.hpp"
#include "kiln_test_paths.h"
#include "plugin/adapters.hpp"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/norm_layer.hpp"

namespace kiln_test {
namespace {

namespace plugin = kiln::plugin;
using kiln::test::bool_value;
using kiln::test::float_value;

const plugin::Registry& registry() {
  static plugin::LibraryLoader loader(plugin::host_api());
  static plugin::Registry r = [] {
    plugin::Registry reg;
    for (const char* lib : {"libkiln_mlp.so", "libkiln_vit.so", "libkiln_resnet.so",
                            "libkiln_batchnorm.so", "libkiln_inplace_abn.so"}) {
      loader.load_library(std::string(KILN_PLUGIN_DIR) + "/" + lib, reg);
    }
    return reg;
  }();
  return r;
}

}  // namespace

std::shared_ptr<kiln::Model> build_model(const std::string& name,
                                         const kiln::config::OptionSet& options, int64_t c,
                                         int64_t hw, const std::string& norm_name) {
  kiln::config::OptionSet bn;
  bn.set("momentum", float_value(0.1));
  bn.set("eps", float_value(1e-5));
  bn.set("affine", bool_value(true));
  bn.set("track_running_stats", bool_value(true));
  const plugin::Component& norm = *registry().find(KILN_COMPONENT_NORM, norm_name);
  const plugin::NormFactory norms = [&](const kiln_norm_request& request) {
    return std::make_shared<plugin::PluginNormLayer>(norm, bn, request);
  };
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  input.channels = c;
  input.height = hw;
  input.width = hw;
  input.num_classes = 5;
  auto model =
      plugin::create_model(*registry().find(KILN_COMPONENT_MODEL, name), options, input, &norms);
  model->train();
  return model;
}

}  // namespace kiln_test
