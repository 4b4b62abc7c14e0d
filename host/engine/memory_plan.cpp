#include "engine/memory_plan.hpp"

#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>

#include <set>

#include "kiln/torch.hpp"
#include "plugin/adapters.hpp"

namespace kiln::engine {
namespace {

int64_t bytes_of(at::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

// Names of everything (parameters and buffers) held by norm layers.
std::set<std::string> norm_tensor_names(torch::nn::Module& model) {
  std::set<std::string> names;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (dynamic_cast<kiln::NormLayer*>(item.value().get()) == nullptr) continue;
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      names.insert(item.key() + "." + p.key());
    }
    for (const auto& b : item.value()->named_buffers(/*recurse=*/false)) {
      names.insert(item.key() + "." + b.key());
    }
  }
  return names;
}

}  // namespace

OptimizerStateCost measure_optimizer_state(const config::Pipeline& p) {
  // A throwaway optimizer instance steps one probe tensor; what it asked the host to allocate is
  // its state. Options are the pipeline's, so e.g. momentum 0 (no buffer) is reflected.
  constexpr int64_t kProbe = 4096;
  // [optimizer]'s (a wrapper with its inner one); [[optimizer.partition]]s' are not counted.
  const config::ComponentChoice& inner = p.inner_optimizer;
  plugin::OptimizerAdapter optimizer(*p.optimizer.component, p.optimizer.options, nullptr,
                                     inner.component,
                                     inner.component != nullptr ? &inner.options : nullptr);
  std::vector<at::Tensor> params = {at::zeros({kProbe}).requires_grad_(true)};
  params[0].mutable_grad() = at::ones_like(params[0]);
  std::vector<std::string> names = {"probe"};
  plugin::GroupStep view;
  view.params = &params;
  view.names = &names;
  view.step = 1;
  view.lr = 1e-3;
  if (optimizer.steps_all()) {
    // A re-evaluation that finds the same gradients: the state is what counts here.
    const plugin::Reevaluate same = [] {
      kiln_reevaluation r{};
      r.struct_size = sizeof(r);
      r.finite = 1;
      return r;
    };
    optimizer.step_all({view}, 0.0, same);
  } else {
    optimizer.step(view);
  }
  OptimizerStateCost cost;
  const auto count = [&](const plugin::StateStore& store) {
    for (const auto& [param, states] : store) {
      for (const auto& [name, t] : states) {
        const double bytes = static_cast<double>(t.numel() * bytes_of(t.scalar_type()));
        if (t.numel() == kProbe) {
          cost.bytes_per_element += bytes / kProbe;
        } else {
          cost.bytes_per_tensor += bytes;
        }
      }
    }
  };
  count(optimizer.state());
  if (optimizer.inner() != nullptr) count(optimizer.inner()->state());
  return cost;
}

MemoryEstimate estimate_memory(torch::nn::Module& model, const std::vector<ParamGroup>& groups,
                               const PrecisionPlan& plan, const OptimizerStateCost& state,
                               bool ema) {
  MemoryEstimate e;
  e.mode = plan.name;
  const std::set<std::string> norm = norm_tensor_names(model);
  // Storage dtype of a floating tensor of the model under this plan.
  auto stored = [&](const std::string& name) {
    return plan.half_model() && !(plan.norm_fp32 && norm.count(name)) ? plan.model_dtype
                                                                      : at::kFloat;
  };
  for (const auto& item : model.named_parameters()) {
    e.weights += item.value().numel() * bytes_of(stored(item.key()));
  }
  for (const auto& item : model.named_buffers()) {
    const at::Tensor& b = item.value();
    e.weights += b.numel() * bytes_of(b.is_floating_point() ? stored(item.key()) : b.scalar_type());
  }
  if (ema) {
    // The average of the model as built (fp32): the same whatever the plan (engine/model_ema).
    for (const auto& item : model.named_parameters()) e.ema += item.value().nbytes();
    for (const auto& item : model.named_buffers()) e.ema += item.value().nbytes();
  }
  for (const auto& group : groups) {
    for (size_t i = 0; i < group.params.size(); ++i) {
      const int64_t n = group.params[i].numel();
      const at::ScalarType dtype = stored(group.names[i]);
      e.gradients += n * bytes_of(dtype);
      const bool master = plan.master_weights && dtype != at::kFloat;
      if (master) e.master_weights += n * bytes_of(at::kFloat);
      // State is allocated like the tensor the optimizer steps.
      const at::ScalarType stepped = master ? at::kFloat : dtype;
      e.optimizer_state += static_cast<int64_t>(
          state.bytes_per_element * static_cast<double>(n * bytes_of(stepped)) / 4.0 +
          state.bytes_per_tensor);
    }
  }
  return e;
}

}  // namespace kiln::engine
