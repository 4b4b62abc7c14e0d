#include "engine/plan.hpp"

#include <fmt/format.h>

#include "engine/param_groups.hpp"
#include "kiln/torch.hpp"
#include "plugin/adapters.hpp"
#include "plugin/host_api.hpp"
#include "plugin/norm_layer.hpp"

namespace kiln::engine {

std::string describe_plan(const config::Pipeline& p) {
  std::string out = "# resolved pipeline: " + p.path + "\n";
  for (const config::ComponentChoice* c :
       {&p.model, &p.norm, &p.optimizer, &p.lr_policy, &p.precision}) {
    const auto& v = c->component->descriptor->version;
    out += fmt::format("# {:<10} {} {}.{}.{}  ({})\n", c->section, c->component->name(), v.major,
                       v.minor, v.patch, c->component->library_path);
  }
  out += "\n" + config::to_toml(p) + "\n";

  // Input geometry as the data section describes it (Fashion-MNIST is 1×28×28, 10 classes).
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  const bool synthetic = p.data.get_string("dataset") == "synthetic";
  input.channels = synthetic ? p.data.get_int("channels") : 1;
  input.height = synthetic ? p.data.get_int("height") : 28;
  input.width = synthetic ? p.data.get_int("width") : 28;
  input.num_classes = synthetic ? p.data.get_int("synthetic_classes") : 10;
  plugin::set_norm_factory([&](const kiln_norm_request& request) {
    return std::make_shared<plugin::PluginNormLayer>(*p.norm.component, p.norm.options, request);
  });
  std::shared_ptr<kiln::Model> model;
  try {
    model = plugin::create_model(*p.model.component, p.model.options, input);
  } catch (...) {
    plugin::set_norm_factory(nullptr);
    throw;
  }
  plugin::set_norm_factory(nullptr);

  const double lr = p.optimizer.core.get_float("lr");
  const double wd = p.optimizer.core.get_float("weight_decay");
  out += "# parameter groups\n";
  int64_t total = 0;
  for (const ParamGroup& g : build_param_groups(*model)) {
    int64_t elements = 0;
    for (const auto& t : g.params) elements += t.numel();
    total += elements;
    out += fmt::format("#   {:<10} {} tensors, {} elements, lr {} (x{}), weight_decay {} (x{})\n",
                       g.name, g.params.size(), elements, lr * g.lr_scale, g.lr_scale,
                       wd * g.decay_scale, g.decay_scale);
  }
  out += fmt::format("# model parameters: {}\n", total);
  const int64_t batch = p.data.get_int("batch_size");
  out += fmt::format("# batch: {} per step = world size 1 x micro-batch {} x accumulation 1\n",
                     batch, batch);
  return out;
}

}  // namespace kiln::engine
