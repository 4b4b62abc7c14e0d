#include "plugin/registry.hpp"

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
