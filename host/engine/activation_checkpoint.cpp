#include "engine/activation_checkpoint.hpp"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_set>

#include "config/suggest.hpp"
#include "engine/checks.hpp"
#include "plugin/norm_layer.hpp"

namespace kiln::engine {
namespace {

using kiln::BlockChain;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Segment = BlockChain::Segment;

// ---- state a recomputation must repeat ---------------------------------------------------------

// The default generators a segment may draw from: the CPU one always (some ops draw on the CPU
// whatever the device), and the input's device's.
std::vector<at::Generator> generators_for(const at::Device& device) {
  std::vector<at::Generator> gens{at::globalContext().defaultGenerator(at::kCPU)};
  if (!device.is_cpu()) gens.push_back(at::globalContext().defaultGenerator(device));
  return gens;
}

std::vector<at::Tensor> get_rng_states(std::vector<at::Generator>& gens) {
  std::vector<at::Tensor> states;
  for (at::Generator& g : gens) {
    std::lock_guard<std::mutex> lock(g.mutex());
    states.push_back(g.get_state());
  }
  return states;
}

void set_rng_states(std::vector<at::Generator>& gens, const std::vector<at::Tensor>& states) {
  for (size_t i = 0; i < gens.size(); ++i) {
    std::lock_guard<std::mutex> lock(gens[i].mutex());
    gens[i].set_state(states[i]);
  }
}

struct AutocastState {
  c10::DeviceType device;
  bool enabled;
  at::ScalarType dtype;
};

std::vector<AutocastState> get_autocast_states(const at::Device& device) {
  std::vector<AutocastState> states;
  for (c10::DeviceType type : {device.type(), c10::DeviceType::CPU}) {
    if (!states.empty() && type == states.front().device) continue;
    states.push_back(
        {type, at::autocast::is_autocast_enabled(type), at::autocast::get_autocast_dtype(type)});
  }
  return states;
}

// Sets the autocast state recorded in forward for its lifetime (backward may run on another
// thread, whose autocast state is its own), then puts the caller's back.
class AutocastRestore {
 public:
  explicit AutocastRestore(const std::vector<AutocastState>& wanted) {
    for (const AutocastState& s : wanted) {
      previous_.push_back({s.device, at::autocast::is_autocast_enabled(s.device),
                           at::autocast::get_autocast_dtype(s.device)});
      at::autocast::set_autocast_enabled(s.device, s.enabled);
      at::autocast::set_autocast_dtype(s.device, s.dtype);
      any_enabled_ = any_enabled_ || s.enabled;
    }
    // As torch.autocast's __enter__: casts cached within this scope are dropped at its end.
    if (any_enabled_) at::autocast::increment_nesting();
  }
  ~AutocastRestore() {
    if (any_enabled_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    for (const AutocastState& s : previous_) {
      at::autocast::set_autocast_enabled(s.device, s.enabled);
      at::autocast::set_autocast_dtype(s.device, s.dtype);
    }
  }
  AutocastRestore(const AutocastRestore&) = delete;
  AutocastRestore& operator=(const AutocastRestore&) = delete;

 private:
  std::vector<AutocastState> previous_;
  bool any_enabled_ = false;
};

// The distinct parameters and buffers of blocks [first, end) (a module shared by two blocks
// counts once).
std::vector<at::Tensor> segment_tensors(const BlockChain& chain, Segment segment, bool buffers) {
  std::vector<at::Tensor> out;
  std::unordered_set<const void*> seen;
  for (size_t i = segment.first; i < segment.second; ++i) {
    for (const at::Tensor& t : buffers ? chain.block(i)->buffers() : chain.block(i)->parameters()) {
      if (t.defined() && seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
    }
  }
  return out;
}

// Whether blocks [first, end) hold an in-place norm layer allowed to overwrite its input
// (layout.in_place with make_norm_layer's may_overwrite_input): the one module here that writes
// over its input. Such a segment runs on a copy of its input, so the input kept for backward
// (and anyone else's saved view of it) stays intact; other segments need no copy.
bool may_overwrite_input(const BlockChain& chain, Segment segment) {
  for (size_t i = segment.first; i < segment.second; ++i) {
    for (const auto& m : chain.block(i)->modules(/*include_self=*/true)) {
      const auto* norm = dynamic_cast<const plugin::PluginNormLayer*>(m.get());
      if (norm != nullptr && norm->layout().in_place != 0 && norm->may_overwrite_input()) {
        return true;
      }
    }
  }
  return false;
}

// What a segment's autograd node needs besides tensors. Kept as the node's data: the chain is
// owned by the model, which outlives every backward of its forward.
struct SegmentRef {
  BlockChain* chain;
  Segment segment;
};

// input, params → blocks [first, end) run without a graph; backward recomputes them with one.
// The parameters are inputs so that (1) the output requires grad even when `input` does not
// (the first block after the images) and (2) their gradients leave through this node into the
// outer engine's AccumulateGrad, where DDP's hooks see them.
struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, at::TensorList params,
                            SegmentRef ref) {
    const at::Device device = input.device();
    std::vector<at::Generator> gens = generators_for(device);
    ctx->saved_data["rng"] = at::IValue(get_rng_states(gens));
    for (const AutocastState& s : get_autocast_states(device)) {
      const std::string key = "autocast." + std::to_string(static_cast<int>(s.device));
      ctx->saved_data[key + ".enabled"] = s.enabled;
      ctx->saved_data[key + ".dtype"] = static_cast<int64_t>(s.dtype);
    }
    ctx->saved_data["chain"] = reinterpret_cast<int64_t>(ref.chain);
    ctx->saved_data["first"] = static_cast<int64_t>(ref.segment.first);
    ctx->saved_data["end"] = static_cast<int64_t>(ref.segment.second);
    // Saved through save_for_backward so an in-place change to the input before backward is
    // caught; the parameters are saved to know, in backward, which gradient goes where.
    variable_list saved{input};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    at::NoGradGuard no_grad;
    const bool copy = may_overwrite_input(*ref.chain, ref.segment);
    ctx->saved_data["copy"] = copy;
    return ref.chain->run(ref.segment.first, ref.segment.second, copy ? input.clone() : input);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* chain = reinterpret_cast<BlockChain*>(ctx->saved_data["chain"].toInt());
    const Segment segment{static_cast<size_t>(ctx->saved_data["first"].toInt()),
                          static_cast<size_t>(ctx->saved_data["end"].toInt())};
    const variable_list saved = ctx->get_saved_variables();
    const at::Device device = saved[0].device();
    const variable_list params(saved.begin() + 1, saved.end());
    std::vector<AutocastState> autocast;
    for (const AutocastState& now : get_autocast_states(device)) {
      const std::string key = "autocast." + std::to_string(static_cast<int>(now.device));
      autocast.push_back({now.device, ctx->saved_data[key + ".enabled"].toBool(),
                          static_cast<at::ScalarType>(ctx->saved_data[key + ".dtype"].toInt())});
    }

    const bool input_grad = ctx->needs_input_grad(0);
    at::Tensor x = saved[0].detach();
    x.requires_grad_(input_grad);

    // Recompute as in forward: its RNG and autocast state, its buffers afterwards.
    std::vector<at::Generator> gens = generators_for(device);
    const std::vector<at::Tensor> caller_rng = get_rng_states(gens);
    const std::vector<at::Tensor> forward_rng = ctx->saved_data["rng"].toTensorVector();
    const std::vector<at::Tensor> buffers = segment_tensors(*chain, segment, /*buffers=*/true);
    std::vector<at::Tensor> buffer_snapshot;
    for (const at::Tensor& b : buffers) buffer_snapshot.push_back(b.clone());
    at::Tensor output;
    {
      set_rng_states(gens, forward_rng);
      AutocastRestore autocast_scope(autocast);
      at::AutoGradMode grad_on(true);
      // A copy is a non-leaf, so an in-place first block does not write to the leaf `x`.
      const bool copy = ctx->saved_data["copy"].toBool();
      output = chain->run(segment.first, segment.second, copy ? x.clone() : x);
    }
    set_rng_states(gens, caller_rng);
    {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(buffer_snapshot[i]);
    }

    // Gradients with respect to the input (if wanted) and the parameters that require one;
    // torch::autograd::grad returns them rather than accumulating into .grad.
    variable_list wrt;
    if (input_grad) wrt.push_back(x);
    std::vector<size_t> param_slot;  // where each of wrt's parameters goes in the result
    for (size_t i = 0; i < params.size(); ++i) {
      if (ctx->needs_input_grad(1 + i)) {
        wrt.push_back(params[i]);
        param_slot.push_back(1 + i);
      }
    }
    // One slot per forward input: input, each parameter, and the SegmentRef.
    variable_list result(params.size() + 2);
    if (wrt.empty() || !output.requires_grad()) return result;
    variable_list grads = torch::autograd::grad({output}, wrt, {grad_outputs[0]},
                                                /*retain_graph=*/false, /*create_graph=*/false,
                                                /*allow_unused=*/true);
    size_t g = 0;
    if (input_grad) result[0] = grads[g++];
    for (size_t slot : param_slot) result[slot] = grads[g++];
    return result;
  }
};

// ---- the spec -----------------------------------------------------------------------------------

struct NamedChain {
  std::string name;
  BlockChain* chain;
  bool outermost;  // not inside a block of another chain
};

std::vector<NamedChain> find_chains(kiln::Model& model) {
  std::vector<NamedChain> chains;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* chain = dynamic_cast<BlockChain*>(item.value().get());
    if (chain == nullptr) continue;
    bool outermost = true;
    for (const NamedChain& c : chains) {
      if (item.key().rfind(c.name + ".", 0) == 0) outermost = false;
    }
    chains.push_back({item.key(), chain, outermost});
  }
  return chains;
}

std::string range_text(Segment s) {
  return s.second - s.first == 1 ? std::to_string(s.first)
                                 : std::to_string(s.first) + "-" + std::to_string(s.second - 1);
}

std::string describe(const std::string& how, const std::vector<NamedChain>& chains,
                     const std::map<BlockChain*, std::vector<Segment>>& plan) {
  std::string text = how + ":";
  bool first_chain = true;
  for (const NamedChain& c : chains) {
    auto it = plan.find(c.chain);
    if (it == plan.end() || it->second.empty()) continue;
    text += first_chain ? " " : "; ";
    first_chain = false;
    const size_t n = it->second.size();
    text += c.name + " " + std::to_string(n) + (n == 1 ? " segment [" : " segments [");
    for (size_t i = 0; i < n; ++i) text += (i ? " " : "") + range_text(it->second[i]);
    text += "] of " + std::to_string(c.chain->size());
  }
  return text;
}

std::string model_label(const std::string& model_name) {
  return model_name.empty() ? "the model" : "model '" + model_name + "'";
}

// "layers (layers.0 … layers.2), blocks (…)": every valid name, compactly.
std::string available_names(const std::vector<NamedChain>& chains) {
  std::string text;
  for (const NamedChain& c : chains) {
    if (!text.empty()) text += ", ";
    text += c.name;
    const size_t m = c.chain->size();
    if (m == 1) text += " (" + c.name + ".0)";
    if (m == 2) text += " (" + c.name + ".0, " + c.name + ".1)";
    if (m > 2) text += " (" + c.name + ".0 … " + c.name + "." + std::to_string(m - 1) + ")";
  }
  return text;
}

// Segments per chain for a list of names.
std::map<BlockChain*, std::vector<Segment>> plan_names(const std::vector<NamedChain>& chains,
                                                       const std::vector<std::string>& names,
                                                       const std::string& model_name) {
  std::map<std::string, std::pair<BlockChain*, std::optional<size_t>>> valid;
  std::vector<std::string> candidates;
  for (const NamedChain& c : chains) {
    valid[c.name] = {c.chain, std::nullopt};
    candidates.push_back(c.name);
    for (size_t i = 0; i < c.chain->size(); ++i) {
      const std::string block = c.name + "." + std::to_string(i);
      valid[block] = {c.chain, i};
      candidates.push_back(block);
    }
  }
  std::map<BlockChain*, std::vector<Segment>> plan;
  std::map<BlockChain*, std::string> first_named;  // per chain, the first name that chose it
  std::map<BlockChain*, bool> whole;
  std::set<std::string> seen;
  for (const std::string& name : names) {
    auto it = valid.find(name);
    if (it == valid.end()) {
      const std::optional<std::string> near = config::nearest(name, candidates);
      throw PipelineError("memory.checkpoint",
                          "memory.checkpoint: " + model_label(model_name) +
                              " has no block or chain '" + name + "'" +
                              (near ? " (did you mean '" + *near + "'?)" : std::string()) +
                              "; available: " + available_names(chains));
    }
    if (!seen.insert(name).second) {
      throw PipelineError("memory.checkpoint", "memory.checkpoint: '" + name + "' is named twice");
    }
    BlockChain* chain = it->second.first;
    const std::optional<size_t> index = it->second.second;
    if (!index && chain->size() == 0) {
      throw PipelineError("memory.checkpoint",
                          "memory.checkpoint: chain '" + name + "' has no blocks");
    }
    if (first_named.count(chain) != 0 && (whole[chain] || !index)) {
      throw PipelineError("memory.checkpoint",
                          "memory.checkpoint: '" + name + "' overlaps '" + first_named[chain] +
                              "'; name either a whole chain or some of its blocks");
    }
    first_named.emplace(chain, name);
    whole[chain] = !index;
    if (index) {
      plan[chain].push_back({*index, *index + 1});
    } else {
      plan[chain].push_back({0, chain->size()});
    }
  }
  for (auto& [chain, segments] : plan) std::sort(segments.begin(), segments.end());
  return plan;
}

// ceil(sqrt(n)) in integers (the double's rounding corrected).
size_t ceil_sqrt(size_t n) {
  size_t k = static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  while (k * k < n) ++k;
  while (k > 0 && (k - 1) * (k - 1) >= n) --k;
  return k;
}

}  // namespace

std::vector<std::vector<Segment>> sqrt_segments(const std::vector<size_t>& chain_sizes) {
  size_t n = 0;
  for (size_t m : chain_sizes) n += m;
  std::vector<std::vector<Segment>> out(chain_sizes.size());
  if (n == 0) return out;
  const size_t k = ceil_sqrt(n);
  for (size_t c = 0; c < chain_sizes.size(); ++c) {
    for (size_t first = 0; first < chain_sizes[c]; first += k) {
      out[c].push_back({first, std::min(first + k, chain_sizes[c])});
    }
  }
  return out;
}

std::string apply_activation_checkpointing(kiln::Model& model, const std::vector<std::string>& spec,
                                           const std::string& model_name) {
  const std::vector<NamedChain> chains = find_chains(model);
  for (const NamedChain& c : chains) c.chain->set_checkpointing({}, nullptr);

  const bool has_keyword = std::any_of(
      spec.begin(), spec.end(), [](const std::string& s) { return s == "none" || s == "sqrt"; });
  if (has_keyword && spec.size() > 1) {
    throw PipelineError(
        "memory.checkpoint",
        "memory.checkpoint: 'none' and 'sqrt' stand alone; give one of them, or a list of block "
        "and chain names, not both");
  }
  if (spec.empty() || spec.front() == "none") return "";

  size_t blocks = 0;
  for (const NamedChain& c : chains) blocks += c.chain->size();
  if (blocks == 0) {
    throw PipelineError(
        "memory.checkpoint",
        "memory.checkpoint: " + model_label(model_name) +
            " exposes no blocks to checkpoint (it registers no kiln::BlockChain with "
            "blocks); set memory.checkpoint = \"none\"");
  }

  std::map<BlockChain*, std::vector<Segment>> plan;
  std::string how;
  if (spec.front() == "sqrt") {
    std::vector<NamedChain> outer;
    std::vector<size_t> sizes;
    for (const NamedChain& c : chains) {
      if (!c.outermost) continue;
      outer.push_back(c);
      sizes.push_back(c.chain->size());
    }
    const std::vector<std::vector<Segment>> segments = sqrt_segments(sizes);
    for (size_t i = 0; i < outer.size(); ++i) plan[outer[i].chain] = segments[i];
    size_t n = 0;
    for (size_t m : sizes) n += m;
    how = "sqrt (n=" + std::to_string(n) + ", k=" + std::to_string(ceil_sqrt(n)) + ")";
  } else {
    plan = plan_names(chains, spec, model_name);
    how = "named";
  }
  for (auto& [chain, segments] : plan) chain->set_checkpointing(segments, &run_checkpointed);
  return describe(how, chains, plan);
}

at::Tensor run_checkpointed(BlockChain& chain, Segment segment, const at::Tensor& x) {
  if (!at::GradMode::is_enabled()) return chain.run(segment.first, segment.second, x);
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : segment_tensors(chain, segment, /*buffers=*/false)) {
    if (p.requires_grad()) params.push_back(p);
  }
  if (params.empty() && !x.requires_grad()) return chain.run(segment.first, segment.second, x);
  return CheckpointFunction::apply(x, at::TensorList(params), SegmentRef{&chain, segment});
}

}  // namespace kiln::engine
