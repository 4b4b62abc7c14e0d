#include "engine/preflight.hpp"

#include <ATen/Context.h>

#include "engine/activation_checkpoint.hpp"
#include "engine/checks.hpp"
#include "engine/loss.hpp"
#include "engine/loss_scaler.hpp"
#include "engine/lr_driver.hpp"
#include "engine/model_build.hpp"
#include "engine/optimizer_side.hpp"
#include "engine/param_groups.hpp"
#include "engine/precision.hpp"
#include "engine/resume.hpp"
#include "engine/run_data.hpp"
#include "kiln/torch.hpp"
#include "plugin/adapters.hpp"

namespace kiln::engine {
std::string preflight(const config::Pipeline& p, c10::Device device, int64_t world_size) {
  return as_config_errors(p, [&] {
    check_pipeline(p, device, world_size);
    plugin::PrecisionAdapter precision(*p.precision.component, p.precision.options, device.type());
    const PrecisionPlan plan = plan_precision(precision.policy(), precision.name());

    const DataSplits splits = load_data(p);
    const data::Source& train = *splits.train;
    const auto shape = train_sample_shape(p.settings.data, train);
    kiln_model_input input{};
    input.struct_size = sizeof(input);
    input.channels = shape[0];
    input.height = shape[1];
    input.width = shape[2];
    input.num_classes = train.num_classes();
    std::shared_ptr<kiln::Model> model =
        build_model(p, input, device.type(), static_cast<int32_t>(world_size), norm_window_for(p));
    load_initial_weights(p, *model);
    (void)apply_activation_checkpointing(*model, p.settings.memory.checkpoint,
                                         std::string(p.model.component->name()));
    cast_model(*model, plan);
    check_model_precision(*model, plan);
    (void)build_loss(p, model, train.num_classes(), device);

    (void)build_param_groups(*model, group_rules(p));
    (void)make_optimizers(p, nullptr);
    const int64_t batches = batches_per_epoch(p.settings.data, train, static_cast<int>(world_size));
    const ScheduleFrame frame = schedule_frame(p, batches);
    plugin::LrPolicyAdapter policy(*p.lr_policy.component, p.lr_policy.options,
                                   to_policy_schedule(frame));
    (void)LossScaler(plan, precision, p.settings.run.max_nonfinite_steps);
    return describe_data(p, splits, shape);
  });
}

}  // namespace kiln::engine
