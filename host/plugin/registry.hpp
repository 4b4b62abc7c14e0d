// The registry of loaded plugin components: every component of every accepted library, by kind
// and name. Filled by the loader; read by config resolution, the CLI and the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/plugin.h"

namespace kiln::plugin {

// One accepted component and where it came from.
struct Component {
  const kiln_component_descriptor* descriptor = nullptr;  // static data of the library
  const kiln_plugin_descriptor* plugin = nullptr;         // its library's descriptor
  std::string library_path;                               // absolute path of the .so
  std::string_view name() const { return descriptor->name; }
  int32_t kind() const { return descriptor->kind; }
};

// "optimizer", "lr_policy", "norm", "precision", "model", "dataset" (or "unknown").
const char* kind_name(int32_t kind);

// What an optimizer component can do beyond `step` (ABI 1.14; false for older libraries):
// step another optimizer (KILN_CAP_WRAPS_OPTIMIZER), take the whole step in one call
// (step_all), give evaluation weights (eval_weights).
bool wraps_optimizer(const Component& c);
bool steps_all_groups(const Component& c);
bool has_eval_weights(const Component& c);
// What an LR policy can do beyond lr_at (ABI 1.15; false for older libraries): react to
// evaluations (observe), keep state for checkpoints (get_state and set_state, both).
bool observes_evaluations(const Component& c);
bool keeps_lr_state(const Component& c);

class Registry {
 public:
  // Adds a component; the loader has already checked names are unique.
  void add(Component component);
  // The component of `kind` called `name`, or nullptr.
  const Component* find(int32_t kind, std::string_view name) const;
  // The component called `name` of any kind, or nullptr.
  const Component* find_any(std::string_view name) const;
  // All components of `kind`, in load order.
  std::vector<const Component*> of_kind(int32_t kind) const;
  // All components, in load order.
  const std::vector<Component>& all() const { return components_; }

 private:
  std::vector<Component> components_;
};

}  // namespace kiln::plugin
