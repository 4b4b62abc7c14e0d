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

namespace {

constexpr int64_t kProbe = 4096;  // values in a probe tensor

// One dry step of `optimizer` on a probe tensor of `shape` (kProbe values).
void step_probe(plugin::OptimizerAdapter& optimizer, at::IntArrayRef shape) {
  std::vector<at::Tensor> params = {at::zeros(shape).requires_grad_(true)};
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
}

// The state `choice` (with `inner` for a wrapper) allocates: a throwaway instance steps a probe
// vector, or a probe matrix when it refuses vectors (Muon); state whose size is a multiple of
// the probe's counts per element (a history of k copies as k), anything else per tensor.
OptimizerStateCost measure_one(const config::ComponentChoice& choice,
                               const config::ComponentChoice& inner) {
  const std::vector<std::vector<int64_t>> shapes = {{kProbe}, {32, kProbe / 32}};
  for (size_t s = 0; s < shapes.size(); ++s) {
    plugin::OptimizerAdapter optimizer(*choice.component, choice.options, nullptr, inner.component,
                                       inner.component != nullptr ? &inner.options : nullptr);
    try {
      step_probe(optimizer, shapes[s]);
    } catch (const std::exception&) {
      if (s + 1 < shapes.size()) continue;
      throw;
    }
    OptimizerStateCost cost;
    const auto count = [&](const plugin::StateStore& store) {
      for (const auto& [param, states] : store) {
        for (const auto& [name, t] : states) {
          const double bytes = static_cast<double>(t.numel() * bytes_of(t.scalar_type()));
          if (t.numel() > 0 && t.numel() % kProbe == 0) {
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
  return {};
}

}  // namespace

std::vector<OptimizerStateCost> measure_optimizer_state(const config::Pipeline& p) {
  // Options are the pipeline's, so e.g. momentum 0 (no buffer) is reflected.
  std::vector<OptimizerStateCost> costs = {measure_one(p.optimizer, p.inner_optimizer)};
  for (const config::OptimizerPartition& part : p.partitions) {
    costs.push_back(measure_one(part.optimizer, config::ComponentChoice{}));
  }
  return costs;
}

MemoryEstimate estimate_memory(torch::nn::Module& model, const std::vector<ParamGroup>& groups,
                               const PrecisionPlan& plan,
                               const std::vector<OptimizerStateCost>& state, bool ema) {
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
      const OptimizerStateCost& cost = state.at(group.optimizer);
      e.optimizer_state += static_cast<int64_t>(
          cost.bytes_per_element * static_cast<double>(n * bytes_of(stepped)) / 4.0 +
          cost.bytes_per_tensor);
    }
  }
  return e;
}

}  // namespace kiln::engine
