#include "engine/plan.hpp"

#include <fmt/format.h>

#include "engine/lr_driver.hpp"
#include "engine/param_groups.hpp"
#include "kiln/torch.hpp"
#include "plugin/adapters.hpp"
#include "plugin/host_api.hpp"
#include "plugin/norm_layer.hpp"

namespace kiln::engine {

std::shared_ptr<kiln::Model> build_model_for_inspection(const config::Pipeline& p) {
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
  try {
    auto model = plugin::create_model(*p.model.component, p.model.options, input);
    plugin::set_norm_factory(nullptr);
    return model;
  } catch (...) {
    plugin::set_norm_factory(nullptr);
    throw;
  }
}

std::string describe_plan(const config::Pipeline& p) {
  std::string out = "# resolved pipeline: " + p.path + "\n";
  for (const config::ComponentChoice* c :
       {&p.model, &p.norm, &p.optimizer, &p.lr_policy, &p.precision}) {
    const auto& v = c->component->descriptor->version;
    out += fmt::format("# {:<10} {} {}.{}.{}  ({})\n", c->section, c->component->name(), v.major,
                       v.minor, v.patch, c->component->library_path);
  }
  out += "\n" + config::to_toml(p) + "\n";

  std::shared_ptr<kiln::Model> model = build_model_for_inspection(p);
  const ScheduleFrame frame = schedule_frame(p, /*iters_per_epoch=*/1);
  out += "# parameter groups (lr = schedule lr x scale; base lr " + fmt::format("{}", frame.base_lr) +
         (frame.base_lr != frame.unscaled_lr ? ", linearly scaled" : "") + ")\n";
  int64_t total = 0;
  for (const ParamGroup& g : build_param_groups(*model, group_rules(p))) {
    int64_t elements = 0;
    for (const auto& t : g.params) elements += t.numel();
    total += elements;
    out += fmt::format("#   {:<10} {} tensors, {} elements, lr {} (x{}), weight_decay {}\n", g.name,
                       g.params.size(), elements, frame.base_lr * g.lr_scale, g.lr_scale,
                       g.weight_decay);
  }
  out += fmt::format("# trainable parameters: {}\n", total);
  out += fmt::format("# batch: {} per step = world size 1 x micro-batch {} x accumulation 1\n",
                     frame.effective_batch, p.data.get_int("batch_size"));
  return out;
}

}  // namespace kiln::engine
