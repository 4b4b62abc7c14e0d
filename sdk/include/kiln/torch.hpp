// kiln/torch.hpp — the torch-bound side of the SDK, for C++ plugins built against the same
// LibTorch as the host: DLTensor views as at::Tensor, and the module interfaces that cross the
// model ABI through kiln_torch_module handles. Plugins that include this header must record
// KILN_TORCH_VERSION / KILN_TORCH_CXX11_ABI in their descriptor when they are torch-bound.
#ifndef KILN_TORCH_HPP_
#define KILN_TORCH_HPP_

#include <ATen/DLConvertor.h>
#include <ATen/core/Tensor.h>
#include <ATen/dlpack.h>
#include <ATen/ops/from_blob.h>
#include <torch/nn/module.h>
#include <torch/version.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/model.h"
#include "kiln/sdk.hpp"

#define KILN_TORCH_VERSION TORCH_VERSION
#ifdef _GLIBCXX_USE_CXX11_ABI
#define KILN_TORCH_CXX11_ABI _GLIBCXX_USE_CXX11_ABI
#else
#define KILN_TORCH_CXX11_ABI 0
#endif

namespace kiln {

// An ordered chain of blocks a model runs one after another (x = block(x)). Models register one
// (or one per stage) as a child module and call its forward; the host may run segments of it
// under activation checkpointing (memory.checkpoint), which keeps only each segment's input and
// recomputes the rest in backward. Blocks are registered as children "0", "1", … of the chain.
class BlockChain : public torch::nn::Module {
 public:
  // Runs blocks [first, end) plainly on `x`.
  using Segment = std::pair<size_t, size_t>;
  // What the host installs: runs blocks [first, end) of `chain` on `x` under checkpointing.
  using Runner = std::function<at::Tensor(BlockChain& chain, Segment segment, const at::Tensor& x)>;

  // Model side: appends a block (any module with `at::Tensor forward(const at::Tensor&)`) and
  // returns it.
  template <typename Block>
  std::shared_ptr<Block> add(std::shared_ptr<Block> block) {
    register_module(std::to_string(blocks_.size()), block);
    blocks_.push_back(block);
    calls_.emplace_back([raw = block.get()](const at::Tensor& x) { return raw->forward(x); });
    return block;
  }

  size_t size() const { return blocks_.size(); }
  const std::shared_ptr<torch::nn::Module>& block(size_t i) const { return blocks_.at(i); }

  // Runs every block: checkpointed segments through the host's runner, the rest plainly.
  at::Tensor forward(at::Tensor x) {
    size_t i = 0;
    for (const Segment& s : segments_) {
      if (s.first > i) x = run(i, s.first, x);
      x = runner_(*this, s, x);
      i = s.second;
    }
    return i < calls_.size() ? run(i, calls_.size(), x) : x;
  }

  // Runs blocks [first, end) plainly.
  at::Tensor run(size_t first, size_t end, at::Tensor x) const {
    for (size_t i = first; i < end; ++i) x = calls_[i](x);
    return x;
  }

  // Host side: checkpoint `segments` (sorted, disjoint, within size()) with `runner`; an empty
  // list turns checkpointing off.
  void set_checkpointing(std::vector<Segment> segments, Runner runner) {
    segments_ = std::move(segments);
    runner_ = std::move(runner);
  }
  const std::vector<Segment>& checkpointed_segments() const { return segments_; }

 private:
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;
  std::vector<std::function<at::Tensor(const at::Tensor&)>> calls_;
  std::vector<Segment> segments_;
  Runner runner_;
};

// A model as the host drives it: logits = forward(images).
class Model : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& input) = 0;
  // Names of the blocks activation checkpointing may wrap: every block of every BlockChain in
  // the model ("layers.0", "layer2.1", …), in forward order.
  virtual std::vector<std::string> block_names() const {
    std::vector<std::string> names;
    for (const auto& item : named_modules("", /*include_self=*/false)) {
      const auto* chain = dynamic_cast<const BlockChain*>(item.value().get());
      if (chain == nullptr) continue;
      for (size_t i = 0; i < chain->size(); ++i)
        names.push_back(item.key() + "." + std::to_string(i));
    }
    return names;
  }
};

// A norm layer: the pipeline's (norm plugin + autograd), which the host builds for a model, or a
// model's own. The host keeps what it holds in float32 under keep_norm_fp32, so its forward must
// take a half input, and groups its parameters as norm parameters (norm_decay_mult).
class NormLayer : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& input) = 0;
};

// A model's own norm layer whose forward wants the model's dtype throughout (a scripted
// LayerNorm or GroupNorm): its parameters are norm parameters to the groups (norm_decay_mult),
// but the host casts them with the rest of the model. Holds parameters only; not a NormLayer.
class NormParameters : public torch::nn::Module {};

// What a kiln_torch_module handle points to: a heap-allocated shared_ptr box.
template <typename T>
struct ModuleBox {
  std::shared_ptr<T> module;
};

// Model plugin side: wraps a new model as the handle `create` returns (owned by the host).
inline kiln_torch_module* release_model(std::shared_ptr<Model> model) {
  return reinterpret_cast<kiln_torch_module*>(new ModuleBox<Model>{std::move(model)});
}
// Model plugin side: the `destroy` slot's body.
inline void destroy_model_handle(kiln_torch_module* handle) {
  delete reinterpret_cast<ModuleBox<Model>*>(handle);
}
// Host side: reads the model out of a handle (the handle still owns its reference).
inline std::shared_ptr<Model> model_from_handle(kiln_torch_module* handle) {
  return reinterpret_cast<ModuleBox<Model>*>(handle)->module;
}

// The model's loss slot (ABI 1.8): a kiln_torch_tensor handle points to an at::Tensor.
// Model plugin side: the tensor behind a borrowed handle (output, target).
inline const at::Tensor& tensor_of(const kiln_torch_tensor* handle) {
  return *reinterpret_cast<const at::Tensor*>(handle);
}
// Model plugin side: assigns `value` to an out handle (loss).
inline void set_tensor(kiln_torch_tensor* handle, at::Tensor value) {
  *reinterpret_cast<at::Tensor*>(handle) = std::move(value);
}
// Host side: handles to tensors it owns, valid while they live.
inline const kiln_torch_tensor* tensor_handle(const at::Tensor& t) {
  return reinterpret_cast<const kiln_torch_tensor*>(&t);
}
inline kiln_torch_tensor* tensor_handle(at::Tensor& t) {
  return reinterpret_cast<kiln_torch_tensor*>(&t);
}

// Model plugin side: where a model's norm layers come from, the host's table and the context of
// the model's create call (kiln_model_input.ctx, ABI 1.6), which names the run being built.
// Built from the host alone (ctx NULL), or from a host before 1.6, it asks through
// create_norm_layer, the thread-bound compatibility path (kiln/host.h).
struct NormSource {
  const kiln_host_api* host = nullptr;
  kiln_call_context* ctx = nullptr;

  NormSource() = default;
  NormSource(const kiln_host_api* h) : host(h) {}  // NOLINT: a host alone converts
  NormSource(const kiln_host_api* h, const kiln_model_input* input)
      : host(h),
        ctx(input != nullptr && KILN_HAS_FIELD(input, kiln_model_input, ctx) ? input->ctx
                                                                             : nullptr) {}
};

// Model plugin side: asks the host for the pipeline's norm layer and takes ownership of it.
// Pass `may_overwrite_input` = true only when the model never reads the layer's input after the
// layer ran (an in-place layer may then overwrite it instead of taking a copy).
inline std::shared_ptr<NormLayer> make_norm_layer(const NormSource& source, int64_t features,
                                                  int32_t activation = KILN_ACT_NONE,
                                                  double activation_param = 0.0,
                                                  bool may_overwrite_input = false) {
  const kiln_host_api* host = source.host;
  kiln_norm_request request{};
  request.struct_size = sizeof(request);
  request.num_features = features;
  request.activation = activation;
  request.may_overwrite_input = may_overwrite_input ? 1 : 0;
  request.activation_param = activation_param;
  kiln_torch_module* handle = nullptr;
  const bool in_ctx = source.ctx != nullptr &&
                      KILN_HAS_FIELD(host, kiln_host_api, create_norm_layer_in) &&
                      host->create_norm_layer_in != nullptr;
  if (!in_ctx && host->create_norm_layer == nullptr) {
    throw Error(KILN_ERR_UNSUPPORTED, "host offers no create_norm_layer");
  }
  kiln_status* status = in_ctx ? host->create_norm_layer_in(source.ctx, &request, &handle)
                               : host->create_norm_layer(&request, &handle);
  if (status != nullptr) {
    // Carry code and message into the exception (the guard turns it back into a status).
    Error error(host->status_code(status), host->status_message(status));
    host->free_status(status);
    throw error;
  }
  auto* box = reinterpret_cast<ModuleBox<NormLayer>*>(handle);
  std::shared_ptr<NormLayer> layer = std::move(box->module);
  delete box;
  return layer;
}
// Host side: boxes a norm layer for create_norm_layer's `*out`.
inline kiln_torch_module* release_norm_layer(std::shared_ptr<NormLayer> layer) {
  return reinterpret_cast<kiln_torch_module*>(new ModuleBox<NormLayer>{std::move(layer)});
}

// The dtypes that cross the ABI: one table read both ways.
struct DtypePair {
  at::ScalarType aten;
  uint8_t code;  // DLDataTypeCode
  uint8_t bits;
};
inline constexpr DtypePair kDtypes[] = {{at::kFloat, kDLFloat, 32},  {at::kHalf, kDLFloat, 16},
                                        {at::kDouble, kDLFloat, 64}, {at::kBFloat16, kDLBfloat, 16},
                                        {at::kLong, kDLInt, 64},     {at::kInt, kDLInt, 32},
                                        {at::kChar, kDLInt, 8},      {at::kByte, kDLUInt, 8}};

// The ATen scalar type of a DLPack dtype.
inline at::ScalarType scalar_type_of(const DLDataType& t) {
  if (t.lanes != 1) throw Error(KILN_ERR_UNSUPPORTED, "vector DLPack dtypes are not supported");
  for (const DtypePair& d : kDtypes) {
    if (d.code == t.code && d.bits == t.bits) return d.aten;
  }
  throw Error(KILN_ERR_UNSUPPORTED, "unsupported DLPack dtype code " + std::to_string(t.code) +
                                        " bits " + std::to_string(t.bits));
}

// A non-owning at::Tensor over a borrowed DLTensor view (valid as long as the view is).
inline at::Tensor as_tensor(const DLTensor& t) {
  at::Device device = t.device.device_type == kDLCUDA
                          ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(t.device.device_id))
                          : at::Device(at::kCPU);
  auto options = at::TensorOptions().dtype(scalar_type_of(t.dtype)).device(device);
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  // The device is named, so from_blob need not ask CUDA where the pointer lives: that query costs
  // a driver call per wrap and refuses the null data of an empty tensor (cuDNN's reserve often is).
  return at::for_blob(data, at::IntArrayRef(t.shape, t.ndim))
      .strides(at::IntArrayRef(t.strides, t.ndim))
      .options(options)
      .target_device(device)
      .make_tensor();
}

// Whether `v` has the dtype, device, shape and strides `t` describes (its memory is not compared).
inline bool same_layout(const at::Tensor& v, const DLTensor& t) {
  if (v.dim() != t.ndim || v.scalar_type() != scalar_type_of(t.dtype)) return false;
  const bool cuda = t.device.device_type == kDLCUDA;
  if (v.is_cuda() != cuda || (cuda && v.get_device() != t.device.device_id)) return false;
  for (int32_t i = 0; i < t.ndim; ++i) {
    if (v.sizes()[i] != t.shape[i] || v.strides()[i] != t.strides[i]) return false;
  }
  return true;
}

// Reuses the at::Tensor wrapper of a view seen before (same data, shape, strides, dtype and
// device). Wrapping allocates a TensorImpl and a storage each time, which an optimizer stepping
// hundreds of tensors per call pays for measurably. A direct-mapped table keyed by the data
// address: a lookup is one slot and a compare, with no hashing, no growth and no sweep; two live
// views sharing a slot only cost a re-wrap. The wrappers do not own memory; one is only handed
// out again when the caller presents the same live view. Not thread-safe: keep one per thread
// (see thread_view_cache()).
class ViewCache {
 public:
  at::Tensor get(const DLTensor& t) {
    const void* data = static_cast<const char*>(t.data) + t.byte_offset;
    Entry& entry = slots_[slot_of(data)];
    if (entry.data == data && entry.view.defined() && same_layout(entry.view, t)) {
      return entry.view;
    }
    entry.data = data;
    entry.view = as_tensor(t);
    return entry.view;
  }

 private:
  static constexpr size_t kSlots = 4096;  // a power of two, well above the views of one step
  struct Entry {
    const void* data = nullptr;
    at::Tensor view;
  };
  // Tensor data is 64-byte aligned: mix the bits above the alignment into the slot index.
  static size_t slot_of(const void* data) {
    const auto bits = reinterpret_cast<uintptr_t>(data) >> 6;
    return (bits ^ (bits >> 12) ^ (bits >> 24)) & (kSlots - 1);
  }
  std::vector<Entry> slots_ = std::vector<Entry>(kSlots);
};

// The calling thread's ViewCache in this library.
inline ViewCache& thread_view_cache() {
  static thread_local ViewCache cache;
  return cache;
}

// The DLPack dtype of an ATen scalar type.
inline DLDataType dl_dtype_of(at::ScalarType type) {
  for (const DtypePair& d : kDtypes) {
    if (d.aten == type) return DLDataType{d.code, d.bits, 1};
  }
  throw Error(KILN_ERR_UNSUPPORTED, "dtype has no DLPack mapping");
}

// A borrowed DLTensor view of `t` (shape and strides point into `t`'s metadata: keep `t` alive
// and unchanged while the view is used).
inline DLTensor as_dltensor(const at::Tensor& t) {
  DLTensor d{};
  d.data = t.data_ptr();
  d.device.device_type = t.is_cuda() ? kDLCUDA : kDLCPU;
  d.device.device_id = t.is_cuda() ? t.get_device() : 0;
  d.ndim = static_cast<int32_t>(t.dim());
  d.dtype = dl_dtype_of(t.scalar_type());
  d.shape = const_cast<int64_t*>(t.sizes().data());
  d.strides = const_cast<int64_t*>(t.strides().data());
  d.byte_offset = 0;
  return d;
}

// Norm plugin side (ABI 1.3, layout.hands_over_gradients): gives `t` to the host through a
// kiln_norm_backward_args.*_result slot; ownership passes with it. A NULL slot (gradient not
// wanted) takes nothing.
inline void hand_over(DLManagedTensor** slot, const at::Tensor& t) {
  if (slot != nullptr) *slot = at::toDLPack(t);
}

}  // namespace kiln

#endif  // KILN_TORCH_HPP_
