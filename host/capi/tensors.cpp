#include "capi/tensors.hpp"

#include <ATen/DLConvertor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/detach.h>
#include <ATen/ops/from_blob.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "capi/guard.hpp"
#include "capi/session.hpp"
#include "engine/model_ema.hpp"
#include "engine/optimizer_side.hpp"
#include "engine/trainer.hpp"

struct kiln_tensor_list {
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;  // handles on the training's own tensors
};

namespace kiln::capi {
namespace {

constexpr uint32_t kAllKinds =
    KILN_TENSORS_PARAMETERS | KILN_TENSORS_BUFFERS | KILN_TENSORS_OPTIMIZER | KILN_TENSORS_AVERAGE;
constexpr uint32_t kAllLoadFlags = KILN_LOAD_ALLOW_MISSING | KILN_LOAD_ALLOW_UNEXPECTED;

// The model's parameters then buffers, by state_dict name, as a checkpoint saves them.
std::vector<std::pair<std::string, at::Tensor>> model_tensors(torch::nn::Module& model,
                                                              uint32_t kinds) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if ((kinds & KILN_TENSORS_PARAMETERS) != 0) {
    for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  }
  if ((kinds & KILN_TENSORS_BUFFERS) != 0) {
    for (const auto& item : model.named_buffers()) out.emplace_back(item.key(), item.value());
  }
  return out;
}

// The optimizer's state as "<parameter>.<slot>", parameters in the model's order (the store is
// keyed by name, which would sort them), then any the model does not name.
// Every optimizer's ([[optimizer.partition]]s' too); a wrapper's inner one as "inner.<slot>".
void add_optimizer_state(engine::Trainer& trainer, kiln_tensor_list& list) {
  std::map<std::string, std::vector<std::pair<std::string, at::Tensor>>> store;
  for (auto& [param, slot, tensor] : trainer.optimizer().state_tensors()) {
    store[param].emplace_back(slot, tensor);
  }
  std::map<std::string, bool> done;
  auto add = [&](const std::string& param) {
    for (const auto& [slot, tensor] : store[param]) {
      list.names.push_back(param + "." + slot);
      list.tensors.push_back(tensor);
    }
    done[param] = true;
  };
  for (const auto& item : trainer.model().named_parameters()) {
    if (store.count(item.key()) != 0) add(item.key());
  }
  for (const auto& [param, slots] : store) {
    if (done.count(param) == 0) add(param);
  }
}

// What session_load_tensors may write, by name: the model's parameters and buffers (their
// names also in `order`: a strict load needs them all), and [ema]'s average as "ema/<name>",
// which may be given but need not be.
std::map<std::string, at::Tensor> load_targets(engine::Trainer& trainer,
                                               std::vector<std::string>& order) {
  std::map<std::string, at::Tensor> targets;
  for (auto& [name, tensor] : model_tensors(trainer.model(), KILN_TENSORS_MODEL)) {
    targets.emplace(name, tensor);
    order.push_back(name);
  }
  if (const engine::ModelEma* ema = trainer.ema()) {
    for (auto& [name, tensor] : ema->named()) targets.emplace(name, tensor);
  }
  return targets;
}

// A borrowed view of a caller's DLPack tensor (its deleter is never called), with its
// byte_offset applied. Throws for a device or dtype ATen cannot take.
at::Tensor view_of(const DLTensor& t, const std::string& name) {
  at::Device device(at::kCPU);
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      break;
    case kDLCUDA:
      device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(t.device.device_id));
      break;
    default:
      throw std::invalid_argument(
          fmt::format("'{}': DLPack device type {} is not supported (CPU or CUDA)", name,
                      static_cast<int>(t.device.device_type)));
  }
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    throw std::invalid_argument(fmt::format("'{}': the DLTensor has no shape", name));
  }
  const at::ScalarType dtype = at::toScalarType(t.dtype);
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  const at::IntArrayRef sizes(t.shape, static_cast<size_t>(t.ndim));
  const auto options = at::TensorOptions().device(device).dtype(dtype);
  const auto borrowed = [](void*) {};  // the caller keeps its tensor
  if (t.strides == nullptr) return at::from_blob(data, sizes, borrowed, options);
  const at::IntArrayRef strides(t.strides, static_cast<size_t>(t.ndim));
  return at::from_blob(data, sizes, strides, borrowed, options);
}

// Up to five of `names` in quotes, then how many more.
std::string some(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 5; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 5) out += fmt::format(" and {} more", names.size() - 5);
  return out;
}

}  // namespace

kiln_status* session_tensors(kiln_session* s, uint32_t kinds, kiln_tensor_list** out) {
  return guarded(KILN_ERR_INTERNAL, [&]() -> kiln_status* {
    if (out == nullptr)
      return make_status(KILN_ERR_INVALID_ARGUMENT, "session_tensors: out is NULL");
    *out = nullptr;
    if (kinds == 0 || (kinds & ~kAllKinds) != 0) {
      return make_status(KILN_ERR_INVALID_ARGUMENT,
                         fmt::format("session_tensors: kinds must be KILN_TENSORS_* bits (1 to "
                                     "15), not {}",
                                     kinds));
    }
    return with_trainer(s, "session_tensors", [&](engine::Trainer& trainer) -> kiln_status* {
      auto list = std::make_unique<kiln_tensor_list>();
      for (auto& [name, tensor] : model_tensors(trainer.model(), kinds)) {
        list->names.push_back(name);
        list->tensors.push_back(tensor);
      }
      if ((kinds & KILN_TENSORS_OPTIMIZER) != 0) add_optimizer_state(trainer, *list);
      if ((kinds & KILN_TENSORS_AVERAGE) != 0) {
        const engine::ModelEma* ema = trainer.ema();
        if (ema == nullptr) {
          return make_status(KILN_ERR_FAILED_PRECONDITION,
                             "session_tensors: KILN_TENSORS_AVERAGE, but the pipeline keeps no "
                             "average ([ema] decay is 0)");
        }
        for (auto& [name, tensor] : ema->named()) {
          list->names.push_back(name);
          list->tensors.push_back(tensor);
        }
      }
      *out = list.release();
      return nullptr;
    });
  });
}

size_t tensor_list_count(const kiln_tensor_list* list) {
  return list != nullptr ? list->names.size() : 0;
}

const char* tensor_list_name(const kiln_tensor_list* list, size_t index) {
  if (list == nullptr || index >= list->names.size()) return nullptr;
  return list->names[index].c_str();
}

kiln_status* tensor_list_get(const kiln_tensor_list* list, size_t index, DLManagedTensor** out) {
  return guarded(KILN_ERR_INTERNAL, [&]() -> kiln_status* {
    if (list == nullptr || out == nullptr) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "tensor_list_get: list or out is NULL");
    }
    *out = nullptr;
    if (index >= list->tensors.size()) {
      return make_status(KILN_ERR_INVALID_ARGUMENT,
                         fmt::format("tensor_list_get: index {} is out of range (the list has {})",
                                     index, list->tensors.size()));
    }
    // detach: the same storage, without the parameter's autograd history or gradient.
    *out = at::toDLPack(list->tensors[index].detach());
    return nullptr;
  });
}

void tensor_list_release(kiln_tensor_list* list) { delete list; }

kiln_status* session_load_tensors(kiln_session* s, const char* const* names,
                                  const DLManagedTensor* const* tensors, size_t count,
                                  uint32_t flags) {
  return guarded(KILN_ERR_INTERNAL, [&]() -> kiln_status* {
    const auto invalid = [](const std::string& why) {
      return make_status(KILN_ERR_INVALID_ARGUMENT, "session_load_tensors: " + why);
    };
    if (count > 0 && (names == nullptr || tensors == nullptr))
      return invalid("names or tensors is NULL");
    if ((flags & ~kAllLoadFlags) != 0) return invalid(fmt::format("unknown flags {}", flags));
    return with_trainer(s, "session_load_tensors", [&](engine::Trainer& trainer) -> kiln_status* {
      std::vector<std::string> order;
      std::map<std::string, at::Tensor> targets = load_targets(trainer, order);
      // Every check first: a refused load changes nothing.
      std::map<std::string, at::Tensor> given;
      std::vector<std::string> unexpected, missing;
      for (size_t i = 0; i < count; ++i) {
        if (names[i] == nullptr || tensors[i] == nullptr)
          return invalid(fmt::format("names[{}] or tensors[{}] is NULL", i, i));
        const std::string name = names[i];
        if (given.count(name) != 0) return invalid(fmt::format("'{}' is given twice", name));
        const auto target = targets.find(name);
        if (target == targets.end()) {
          if ((flags & KILN_LOAD_ALLOW_UNEXPECTED) == 0) unexpected.push_back(name);
          continue;
        }
        at::Tensor source;
        try {
          source = view_of(tensors[i]->dl_tensor, name);
        } catch (const std::exception& e) {
          return invalid(fmt::format("'{}': {}", name, e.what()));
        }
        const at::Tensor& t = target->second;
        if (source.sizes() != t.sizes()) {
          return invalid(fmt::format("'{}' has shape [{}], the model's is [{}]", name,
                                     fmt::join(source.sizes(), ", "), fmt::join(t.sizes(), ", ")));
        }
        const bool both_float =
            at::isFloatingType(source.scalar_type()) && at::isFloatingType(t.scalar_type());
        if (!both_float && source.scalar_type() != t.scalar_type()) {
          return invalid(fmt::format("'{}' has dtype {}, the model's is {}", name,
                                     c10::toString(source.scalar_type()),
                                     c10::toString(t.scalar_type())));
        }
        given.emplace(name, source);
      }
      if ((flags & KILN_LOAD_ALLOW_MISSING) == 0) {
        for (const auto& name : order) {
          if (given.count(name) == 0) missing.push_back(name);
        }
      }
      if (!unexpected.empty() || !missing.empty()) {
        std::string why;
        if (!unexpected.empty()) {
          why = "the model has no tensor " + some(unexpected) +
                " (KILN_LOAD_ALLOW_UNEXPECTED skips them)";
        }
        if (!missing.empty()) {
          why += std::string(why.empty() ? "" : "; ") + "not given: " + some(missing) +
                 " (KILN_LOAD_ALLOW_MISSING keeps them)";
        }
        return invalid(why);
      }
      at::NoGradGuard no_grad;
      for (const auto& [name, source] : given) targets.at(name).copy_(source);
      // A half-precision model's fp32 masters are what the optimizer steps: load them too, from
      // the given values rather than their rounded copies.
      const engine::MasterWeights& masters = trainer.optimizer().updates().stepped();
      if (masters.enabled()) {
        for (size_t k = 0; k < masters.flat().size(); ++k) {
          const auto it = given.find(masters.flat_names()[k]);
          if (it != given.end()) masters.flat()[k].copy_(it->second);
        }
      }
      return nullptr;
    });
  });
}

}  // namespace kiln::capi
