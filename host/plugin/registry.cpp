#include "plugin/registry.hpp"

#include "kiln/lr_policy.h"
#include "kiln/optimizer.h"

namespace kiln::plugin {

const char* kind_name(int32_t kind) {
  switch (kind) {
    case KILN_COMPONENT_OPTIMIZER:
      return "optimizer";
    case KILN_COMPONENT_LR_POLICY:
      return "lr_policy";
    case KILN_COMPONENT_NORM:
      return "norm";
    case KILN_COMPONENT_PRECISION:
      return "precision";
    case KILN_COMPONENT_MODEL:
      return "model";
    case KILN_COMPONENT_DATASET:
      return "dataset";
    default:
      return "unknown";
  }
}

namespace {

// The optimizer vtable of `c` when its library is of ABI 1.14 or later, else null.
const kiln_optimizer_vtable* optimizer_v1_14(const Component& c) {
  if (c.kind() != KILN_COMPONENT_OPTIMIZER || c.plugin == nullptr || c.plugin->abi_minor < 14 ||
      c.descriptor->vtable == nullptr) {
    return nullptr;
  }
  return static_cast<const kiln_optimizer_vtable*>(c.descriptor->vtable);
}

// The LR policy vtable of `c` when its library is of ABI 1.15 or later, else null.
const kiln_lr_policy_vtable* lr_policy_v1_15(const Component& c) {
  if (c.kind() != KILN_COMPONENT_LR_POLICY || c.plugin == nullptr || c.plugin->abi_minor < 15 ||
      c.descriptor->vtable == nullptr) {
    return nullptr;
  }
  return static_cast<const kiln_lr_policy_vtable*>(c.descriptor->vtable);
}

}  // namespace

bool observes_evaluations(const Component& c) {
  const kiln_lr_policy_vtable* v = lr_policy_v1_15(c);
  return v != nullptr && KILN_HAS_FIELD(v, kiln_lr_policy_vtable, observe) && v->observe != nullptr;
}

bool keeps_lr_state(const Component& c) {
  const kiln_lr_policy_vtable* v = lr_policy_v1_15(c);
  return v != nullptr && KILN_HAS_FIELD(v, kiln_lr_policy_vtable, set_state) &&
         v->get_state != nullptr && v->set_state != nullptr;
}

bool wraps_optimizer(const Component& c) {
  return optimizer_v1_14(c) != nullptr && c.descriptor->capabilities != nullptr &&
         (c.descriptor->capabilities->flags & KILN_CAP_WRAPS_OPTIMIZER) != 0;
}

bool steps_all_groups(const Component& c) {
  const kiln_optimizer_vtable* v = optimizer_v1_14(c);
  return v != nullptr && KILN_HAS_FIELD(v, kiln_optimizer_vtable, step_all) &&
         v->step_all != nullptr;
}

bool has_eval_weights(const Component& c) {
  const kiln_optimizer_vtable* v = optimizer_v1_14(c);
  return v != nullptr && KILN_HAS_FIELD(v, kiln_optimizer_vtable, eval_weights) &&
         v->eval_weights != nullptr;
}

void Registry::add(Component component) { components_.push_back(std::move(component)); }

const Component* Registry::find(int32_t kind, std::string_view name) const {
  for (const auto& c : components_) {
    if (c.kind() == kind && c.name() == name) return &c;
  }
  return nullptr;
}

const Component* Registry::find_any(std::string_view name) const {
  for (const auto& c : components_) {
    if (c.name() == name) return &c;
  }
  return nullptr;
}

std::vector<const Component*> Registry::of_kind(int32_t kind) const {
  std::vector<const Component*> out;
  for (const auto& c : components_) {
    if (c.kind() == kind) out.push_back(&c);
  }
  return out;
}

}  // namespace kiln::plugin
