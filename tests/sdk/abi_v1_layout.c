/* Pins the layout of every ABI 1.0 struct on LP64 targets (x86_64, aarch64 Linux): a change to
 * any size or offset here is an ABI break and needs KILN_ABI_MAJOR bumped (or, for appended
 * fields, KILN_ABI_MINOR and a new pinned size). Compiled by the sdk_abi_v1_layout test. */
#include "kiln/dataset.h"
#include "kiln/lr_policy.h"
#include "kiln/model.h"
#include "kiln/norm.h"
#include "kiln/optimizer.h"
#include "kiln/plugin.h"
#include "kiln/precision.h"

#define PIN_SIZE(type, bytes) _Static_assert(sizeof(type) == (bytes), #type " size changed")
#define PIN_OFFSET(type, field, bytes) \
  _Static_assert(offsetof(type, field) == (bytes), #type "." #field " moved")

_Static_assert(KILN_ABI_MAJOR == 1, "these pins are for ABI 1");

PIN_SIZE(kiln_version, 12);
PIN_SIZE(kiln_capabilities, 32);
PIN_OFFSET(kiln_capabilities, attributes, 24);
PIN_SIZE(kiln_option_spec, 72);
PIN_OFFSET(kiln_option_spec, default_value, 48);
PIN_OFFSET(kiln_option_spec, doc, 64);
PIN_SIZE(kiln_option_value, 80);
PIN_OFFSET(kiln_option_value, string_list, 72);
PIN_SIZE(kiln_options, 24);

PIN_SIZE(kiln_norm_request, 32);
PIN_OFFSET(kiln_norm_request, may_overwrite_input, 20); /* 1.2: was `reserved` (zero) */
PIN_SIZE(kiln_host_api, 152); /* 1.6: create_norm_layer_in; 1.14: reevaluate, inner_step,
                                 state_tensor_shaped */
PIN_OFFSET(kiln_host_api, make_status, 16);
PIN_OFFSET(kiln_host_api, state_tensor, 32);
PIN_OFFSET(kiln_host_api, allreduce, 64);
PIN_OFFSET(kiln_host_api, create_norm_layer, 88);
_Static_assert(KILN_HOST_API_V1_SIZE == 120, "host api v1 size");
PIN_OFFSET(kiln_host_api, create_norm_layer_in, 120);
PIN_OFFSET(kiln_host_api, reevaluate, 128);
PIN_OFFSET(kiln_host_api, inner_step, 136);
PIN_OFFSET(kiln_host_api, state_tensor_shaped, 144);
PIN_SIZE(kiln_reevaluation, 24); /* 1.14 */
PIN_OFFSET(kiln_reevaluation, finite, 16);

PIN_SIZE(kiln_component_descriptor, 80);
PIN_OFFSET(kiln_component_descriptor, name, 16);
PIN_OFFSET(kiln_component_descriptor, capabilities, 48);
PIN_OFFSET(kiln_component_descriptor, vtable, 72);
_Static_assert(KILN_COMPONENT_DESCRIPTOR_V1_SIZE == 80, "component descriptor v1 size");
PIN_SIZE(kiln_plugin_descriptor, 80);
PIN_OFFSET(kiln_plugin_descriptor, components, 48);
PIN_OFFSET(kiln_plugin_descriptor, init, 56);
PIN_OFFSET(kiln_plugin_descriptor, torch_version, 64);
_Static_assert(KILN_PLUGIN_DESCRIPTOR_V1_SIZE == 80, "plugin descriptor v1 size");

PIN_SIZE(kiln_param_group, 104); /* 1.4: reuse_token, lr_tensor, found_inf */
PIN_OFFSET(kiln_param_group, lr, 56);
_Static_assert(KILN_PARAM_GROUP_V1_0_SIZE == 80, "param group v1.0 size");
PIN_OFFSET(kiln_param_group, reuse_token, 80);
PIN_OFFSET(kiln_param_group, found_inf, 96);
PIN_SIZE(kiln_optimizer_vtable, 48); /* 1.14: eval_weights, step_all */
_Static_assert(KILN_OPTIMIZER_VTABLE_V1_SIZE == 32, "optimizer vtable v1 size");
_Static_assert(KILN_OPTIMIZER_VTABLE_V1_13_SIZE == 32, "optimizer vtable v1.13 size");
PIN_OFFSET(kiln_optimizer_vtable, eval_weights, 32);
PIN_OFFSET(kiln_optimizer_vtable, step_all, 40);
PIN_SIZE(kiln_optimizer_step_args, 48); /* 1.14 */
PIN_OFFSET(kiln_optimizer_step_args, ctx, 32);
PIN_OFFSET(kiln_optimizer_step_args, loss, 40);
PIN_SIZE(kiln_lr_schedule, 40);
PIN_SIZE(kiln_lr_policy_vtable, 56); /* 1.15: observe, get_state, set_state */
_Static_assert(KILN_LR_POLICY_VTABLE_V1_SIZE == 32, "lr policy vtable v1 size");
_Static_assert(KILN_LR_POLICY_VTABLE_V1_14_SIZE == 32, "lr policy vtable v1.14 size");
PIN_OFFSET(kiln_lr_policy_vtable, observe, 32);
PIN_OFFSET(kiln_lr_policy_vtable, get_state, 40);
PIN_OFFSET(kiln_lr_policy_vtable, set_state, 48);
PIN_SIZE(kiln_lr_observation, 48); /* 1.15 */
PIN_OFFSET(kiln_lr_observation, iter, 8);
PIN_OFFSET(kiln_lr_observation, epoch, 16);
PIN_OFFSET(kiln_lr_observation, count, 24);
PIN_OFFSET(kiln_lr_observation, names, 32);
PIN_OFFSET(kiln_lr_observation, values, 40);
PIN_SIZE(kiln_norm_setup, 40);               /* 1.9: device_type, reserved appended */
PIN_OFFSET(kiln_norm_setup, world_size, 20); /* 1.5: was `reserved` (zero) */
_Static_assert(KILN_NORM_SETUP_V1_8_SIZE == 32, "norm setup v1.8 size");
PIN_OFFSET(kiln_norm_setup, device_type, 32);
PIN_OFFSET(kiln_norm_setup, reserved, 36);
PIN_SIZE(kiln_norm_layout, 40); /* 1.2: in_place, frozen; 1.3: hands_over_gradients */
_Static_assert(KILN_NORM_LAYOUT_V1_0_SIZE == 24, "norm layout v1.0 size");
PIN_OFFSET(kiln_norm_layout, in_place, 24);
PIN_OFFSET(kiln_norm_layout, frozen, 28);
PIN_OFFSET(kiln_norm_layout, hands_over_gradients, 32);
PIN_SIZE(kiln_norm_forward_args, 104); /* 1.5: batch_stats; 1.11: reserve_result appended */
_Static_assert(KILN_NORM_FORWARD_ARGS_V1_4_SIZE == 88, "norm forward args v1.4 size");
PIN_OFFSET(kiln_norm_forward_args, batch_stats, 88);
_Static_assert(KILN_NORM_FORWARD_ARGS_V1_5_SIZE == 96, "norm forward args v1.5 size");
PIN_OFFSET(kiln_norm_forward_args, reserve_result, 96);
PIN_SIZE(kiln_norm_batch_stats, 48); /* 1.5 */
PIN_OFFSET(kiln_norm_batch_stats, count, 24);
PIN_OFFSET(kiln_norm_batch_stats, reported, 40);
PIN_SIZE(kiln_norm_backward_args, 152); /* 1.3: grad_*_result; 1.11: reserve; 1.12: saved_output */
_Static_assert(KILN_NORM_BACKWARD_ARGS_V1_2_SIZE == 112, "norm backward args v1.2 size");
PIN_OFFSET(kiln_norm_backward_args, grad_input_result, 112);
PIN_OFFSET(kiln_norm_backward_args, grad_bias_result, 128);
_Static_assert(KILN_NORM_BACKWARD_ARGS_V1_3_SIZE == 136, "norm backward args v1.3 size");
PIN_OFFSET(kiln_norm_backward_args, reserve, 136);
_Static_assert(KILN_NORM_BACKWARD_ARGS_V1_11_SIZE == 144, "norm backward args v1.11 size");
PIN_OFFSET(kiln_norm_backward_args, saved_output, 144);
PIN_SIZE(kiln_norm_vtable, 40);
_Static_assert(KILN_NORM_VTABLE_V1_SIZE == 40, "norm vtable v1 size");
PIN_SIZE(kiln_precision_policy, 56); /* 1.1: min_scale, at_min_scale appended */
_Static_assert(KILN_PRECISION_POLICY_V1_0_SIZE == 40, "precision policy v1.0 size");
PIN_OFFSET(kiln_precision_policy, min_scale, 40);
PIN_OFFSET(kiln_precision_policy, at_min_scale, 48);
PIN_SIZE(kiln_precision_vtable, 56); /* 1.1: get_state, set_state appended */
PIN_OFFSET(kiln_precision_vtable, get_state, 40);
_Static_assert(KILN_PRECISION_VTABLE_V1_SIZE == 40, "precision vtable v1 size");
PIN_SIZE(kiln_model_input, 48); /* 1.6: ctx appended */
PIN_OFFSET(kiln_model_input, ctx, 40);
PIN_SIZE(kiln_model_vtable, 32); /* 1.8: loss appended */
PIN_OFFSET(kiln_model_vtable, loss, 24);
_Static_assert(KILN_MODEL_VTABLE_V1_SIZE == 24, "model vtable v1 size");
_Static_assert(KILN_MODEL_VTABLE_V1_8_SIZE == 32, "model vtable 1.8 size");

/* 1.7: the dataset component (kiln/dataset.h) */
PIN_SIZE(kiln_dataset_open, 32); /* 1.13: max_pixels appended */
PIN_SIZE(kiln_dataset_info, 64); /* 1.10: target_kind, reserved2 appended */
PIN_OFFSET(kiln_dataset_info, num_samples, 8);
PIN_OFFSET(kiln_dataset_info, channels, 24);
PIN_OFFSET(kiln_dataset_info, height, 32);
PIN_OFFSET(kiln_dataset_info, class_names, 48);
PIN_SIZE(kiln_sample_header, 32);
PIN_SIZE(kiln_decode_request, 32);
PIN_OFFSET(kiln_decode_request, pixels, 16);
PIN_OFFSET(kiln_decode_request, capacity, 24);
PIN_SIZE(kiln_decoded_sample, 40);
PIN_OFFSET(kiln_decoded_sample, scale, 32);
PIN_SIZE(kiln_dataset_vtable, 64); /* 1.10: targets; 1.13: sample_name appended */
_Static_assert(KILN_DATASET_VTABLE_V1_SIZE == 48, "dataset vtable v1 size");
_Static_assert(KILN_COMPONENT_DATASET == 6, "dataset kind");
_Static_assert(KILN_ERR_DATA_LOSS == 7, "data-loss code");

/* 1.8: the model's own loss (kiln/model.h) */
PIN_SIZE(kiln_model_loss_args, 48);
PIN_OFFSET(kiln_model_loss_args, training, 8);
PIN_OFFSET(kiln_model_loss_args, ctx, 16);
PIN_OFFSET(kiln_model_loss_args, output, 24);
PIN_OFFSET(kiln_model_loss_args, target, 32);
PIN_OFFSET(kiln_model_loss_args, loss, 40);

/* 1.10: multi-label targets (kiln/dataset.h) */
PIN_OFFSET(kiln_dataset_info, target_kind, 56);
PIN_OFFSET(kiln_dataset_info, reserved2, 60);
_Static_assert(KILN_DATASET_INFO_V1_7_SIZE == 56, "dataset info 1.7 size");
PIN_OFFSET(kiln_dataset_vtable, targets, 48);
_Static_assert(KILN_DATASET_VTABLE_V1_10_SIZE == 56, "dataset vtable 1.10 size");
_Static_assert(KILN_TARGET_CLASS == 0 && KILN_TARGET_MULTI_LABEL == 1, "target kinds");

/* 1.13: data from elsewhere (kiln/dataset.h) */
PIN_OFFSET(kiln_dataset_open, seed, 16);
PIN_OFFSET(kiln_dataset_open, max_pixels, 24);
_Static_assert(KILN_DATASET_OPEN_V1_7_SIZE == 24, "dataset open 1.7 size");
PIN_OFFSET(kiln_dataset_vtable, sample_name, 56);
_Static_assert(KILN_DATASET_VTABLE_V1_13_SIZE == 64, "dataset vtable 1.13 size");
_Static_assert(KILN_PIXELS_WITHIN == 0 && KILN_PIXELS_WARN == 1 && KILN_PIXELS_REFUSE == 2,
               "pixel-limit verdicts");
