// One adapter per component kind: each turns a plugin's C vtable into a C++ object the engine
// uses, and is the only place the engine crosses the ABI (statuses become exceptions here).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/options.hpp"
#include "kiln/lr_policy.h"
#include "kiln/model.h"
#include "kiln/optimizer.h"
#include "kiln/precision.h"
#include "plugin/host_api.hpp"
#include "plugin/registry.hpp"

namespace kiln {
class Model;
}

namespace kiln::plugin {

// Why `component` cannot run on `device` with `dtype`, or "" when it can.
std::string capability_problem(const Component& component, c10::DeviceType device,
                               at::ScalarType dtype);

// The parameters of one group as the optimizer sees them at one step.
struct GroupStep {
  const std::vector<at::Tensor>* params = nullptr;  // parameters (leaf tensors)
  const std::vector<std::string>* names = nullptr;  // their names
  size_t group_index = 0;
  int64_t step = 0;           // 1-based applied-step count
  double lr = 0.0;            // effective lr
  double weight_decay = 0.0;  // effective weight decay
  // A capturable step (OptimizerAdapter::capturable()), else both undefined: 0-dim float32
  // tensors on the parameters' device, the group's lr and the non-finite flag, which the
  // plugin reads on the device only (`step` and `lr` above are then stale in a replay).
  at::Tensor lr_tensor;
  at::Tensor found_inf;
};

// One optimizer step's re-evaluation (kiln_host_api.reevaluate): the loss and gradients at
// the weights the plugin wrote, in the same gradient memory.
using Reevaluate = std::function<kiln_reevaluation()>;

class OptimizerAdapter {
 public:
  // `group`: the run's process group, behind the collectives of the plugin's steps (it must
  // outlive the adapter); nullptr for a single process. `inner` (with its options): the
  // optimizer a wrapper (KILN_CAP_WRAPS_OPTIMIZER) steps, created alongside.
  OptimizerAdapter(const Component& component, const config::OptionSet& options,
                   dist::ProcessGroup* group = nullptr, const Component* inner = nullptr,
                   const config::OptionSet* inner_options = nullptr);
  ~OptimizerAdapter();
  OptimizerAdapter(const OptimizerAdapter&) = delete;
  OptimizerAdapter& operator=(const OptimizerAdapter&) = delete;

  // Updates every parameter of the group that has a gradient (not for steps_all()).
  void step(const GroupStep& group);
  // The whole step over every group of this optimizer (steps_all()): `loss` is the window's
  // mean loss, `reevaluate` the closure the plugin may call.
  void step_all(const std::vector<GroupStep>& groups, double loss, const Reevaluate& reevaluate);
  // Whether the plugin takes the whole step in one call (step_all, ABI 1.14).
  bool steps_all() const { return steps_all_; }
  // Whether the plugin gives evaluation weights (eval_weights, ABI 1.14).
  bool has_eval_weights() const { return eval_weights_; }
  // The group's evaluation weights into `out` (one tensor like each parameter of the group, in
  // its order; parameters that never had a gradient get a copy of themselves).
  void eval_weights(const GroupStep& group, const std::vector<at::Tensor>& out);
  // The inner optimizer of a wrapper, else null.
  OptimizerAdapter* inner() { return inner_.get(); }
  const OptimizerAdapter* inner() const { return inner_.get(); }
  // Whether the plugin may be recorded into a CUDA graph (KILN_CAP_CAPTURABLE, ABI >= 1.4).
  bool capturable() const { return capturable_; }
  // The state store; the caller may change it (resume), so the per-group views are rebuilt.
  StateStore& state() {
    ++state_epoch_;
    return state_;
  }
  const StateStore& state() const { return state_; }
  const std::string& name() const { return name_; }

 private:
  std::string where(const char* entry) const;  // "optimizer '<name>' <entry> (<library>)"
  std::string name_;
  std::string library_;
  const kiln_optimizer_vtable* vtable_;
  void* instance_ = nullptr;
  bool capturable_ = false;
  bool steps_all_ = false;
  bool eval_weights_ = false;
  dist::ProcessGroup* group_;
  std::unique_ptr<OptimizerAdapter> inner_;
  StateStore state_;
  uint64_t state_epoch_ = 0;  // bumped whenever state() hands out the store
  uint64_t last_token_ = 0;   // the last kiln_param_group.reuse_token handed out

  // What a group's step passes to the plugin besides the gradients, kept while the group's
  // parameters with a gradient stay the same (every step, in the usual run), so that a step
  // copies no names, looks up no state by name and rebuilds no parameter view; the plugin gets
  // the same reuse_token for as long.
  struct LiveGroup {
    // The live parameters and their memory, to see whether anything changed.
    std::vector<std::pair<const c10::TensorImpl*, const void*>> key;
    const std::vector<std::string>* names_source = nullptr;  // the GroupStep's names
    uint64_t state_epoch = 0;
    uint64_t token = 0;
    std::vector<at::Tensor> params;
    std::vector<DLTensor> param_views;
    std::vector<ParamState*> state;
    std::vector<const char*> names;  // into the GroupStep's names, which outlive the run
  };
  LiveGroup& live_group(const GroupStep& group);
  // The plugin's view of a live group (grads from `grad_views`, which must outlive the call).
  kiln_param_group group_view(const GroupStep& group, const LiveGroup& live,
                              std::vector<DLTensor>& grad_views) const;
  // The inner optimizer's step on `group`'s parameters, as the wrapper passes them.
  void inner_step(const GroupStep& group, const kiln_param_group& view);
  std::vector<LiveGroup> live_;  // by group index
  std::vector<std::pair<const c10::TensorImpl*, const void*>> key_scratch_;
  std::vector<DLTensor> grad_views_;  // reused per call
};

class LrPolicyAdapter {
 public:
  LrPolicyAdapter(const Component& component, const config::OptionSet& options,
                  const kiln_lr_schedule& schedule);
  ~LrPolicyAdapter();
  LrPolicyAdapter(const LrPolicyAdapter&) = delete;
  LrPolicyAdapter& operator=(const LrPolicyAdapter&) = delete;
  double lr_at(int64_t iter) const;  // 1-based iteration past warm-up
  const std::string& name() const { return name_; }
  // ABI 1.15: whether the policy reacts to evaluations, and keeps state for checkpoints.
  bool observes() const { return observes_; }
  bool keeps_state() const { return keeps_state_; }
  // One evaluation's metrics (name, value) after `iter` counted steps, closing `epoch`. Does
  // nothing for a policy that does not observe. Throws ComponentError on a refusal.
  void observe(int64_t iter, int64_t epoch,
               const std::vector<std::pair<std::string, double>>& metrics);
  // The policy's state (empty when it keeps none), and its restoration into this instance.
  std::vector<double> state() const;
  void restore_state(const std::vector<double>& values);

 private:
  std::string where(const char* entry) const;
  std::string name_;
  std::string library_;
  const kiln_lr_policy_vtable* vtable_;
  void* instance_ = nullptr;
  bool observes_ = false;
  bool keeps_state_ = false;
};

class PrecisionAdapter {
 public:
  PrecisionAdapter(const Component& component, const config::OptionSet& options,
                   c10::DeviceType device);
  ~PrecisionAdapter();
  PrecisionAdapter(const PrecisionAdapter&) = delete;
  PrecisionAdapter& operator=(const PrecisionAdapter&) = delete;
  const kiln_precision_policy& policy() const { return policy_; }
  const std::string& name() const { return name_; }
  // Whether the plugin has a scale-update rule (without one the scale never changes).
  bool has_scale_rule() const;
  // The plugin's rule: the scale after a step whose gradients were (not) all finite. Throws
  // ComponentError on a failed call or a scale that is not finite and positive.
  double update_scale(bool grads_finite, double scale);
  // The scale rule's own counters (empty when the plugin keeps none), and their restoration.
  std::vector<double> scale_rule_state() const;
  void restore_scale_rule_state(const std::vector<double>& values);

 private:
  std::string where(const char* entry) const;
  std::string name_;
  std::string library_;
  const kiln_precision_vtable* vtable_;
  void* instance_ = nullptr;
  kiln_precision_policy policy_{};
};

// Builds a model from its plugin. The returned module keeps working after the handle is gone.
// `norm_factory` builds every norm layer the model asks for, through the create call's context
// (kiln_model_input.ctx) or, for a model built before ABI 1.6, through the binding of this
// thread to that context for the call (ModelCreateBinding); nullptr: the model may ask for none.
std::shared_ptr<kiln::Model> create_model(const Component& component,
                                          const config::OptionSet& options,
                                          const kiln_model_input& input,
                                          const NormFactory* norm_factory = nullptr);

// Whether `component` (a model) computes its own loss: its vtable has the loss slot (ABI 1.8,
// covered by its struct_size) and fills it.
bool has_model_loss(const Component& component);

// A model's own loss (kiln_model_vtable.loss), called through a handle the adapter keeps to the
// model for its life.
class ModelLossAdapter {
 public:
  // `component` must have the slot (has_model_loss). `group`: the run's process group, which
  // the call's context carries (it must outlive the adapter); nullptr for a single process.
  ModelLossAdapter(const Component& component, std::shared_ptr<kiln::Model> model,
                   dist::ProcessGroup* group = nullptr);
  ~ModelLossAdapter();
  ModelLossAdapter(const ModelLossAdapter&) = delete;
  ModelLossAdapter& operator=(const ModelLossAdapter&) = delete;

  // The batch's loss from the model's `output` and `target` (labels or soft targets): a
  // floating 0-d tensor on the output's device, as float32. Throws ComponentError on a status
  // or on a result of another shape, dtype or device.
  at::Tensor operator()(const at::Tensor& output, const at::Tensor& target, bool training) const;
  const std::string& name() const { return name_; }

 private:
  const Component& component_;
  std::string name_;
  const kiln_model_vtable* vtable_;
  kiln_torch_module* handle_;  // a box of the model, owned here
  mutable kiln_call_context ctx_;
};

}  // namespace kiln::plugin
