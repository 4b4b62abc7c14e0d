#include "engine/conv_layouts.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/cpu/Utils.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/record_function.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/memory_format.hpp"

namespace kiln::engine {
namespace {

// RecordFunction's callbacks are plain function pointers, so the trace under way on this thread
// is where they write: set by TraceScope for one forward, null otherwise.
thread_local std::vector<ConvCall>* active_trace = nullptr;

bool is_convolution(const at::RecordFunction& fn) {
  return std::strcmp(fn.name(), "aten::convolution") == 0;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (active_trace == nullptr || !is_convolution(fn)) return nullptr;
  const auto in = fn.inputs();
  if (in.size() < 7 || !in[0].isTensor() || !in[1].isTensor()) return nullptr;
  const at::Tensor& x = in[0].toTensor();
  const at::Tensor& w = in[1].toTensor();
  const bool transposed = in[6].isBool() && in[6].toBool();
  if (transposed || x.dim() != 4 || w.dim() != 4 || w.size(1) == 0) return nullptr;
  ConvCall c;
  c.weight = w.unsafeGetTensorImpl();
  c.in_channels = x.size(1);
  c.groups = x.size(1) / w.size(1);
  c.kernel_h = w.size(2);
  c.kernel_w = w.size(3);
  c.input_channels_last = x.is_contiguous(at::MemoryFormat::ChannelsLast) && !x.is_contiguous();
  active_trace->push_back(c);
  return nullptr;
}

// The output's size, once the convolution has run (ATen's convolutions do not nest).
void on_exit(const at::RecordFunction& fn, at::ObserverContext* /*unused*/) {
  if (active_trace == nullptr || active_trace->empty() || !is_convolution(fn)) return;
  const auto& out = fn.outputs();
  if (out.empty() || !out[0].isTensor() || out[0].toTensor().dim() != 4) return;
  ConvCall& c = active_trace->back();
  c.out_h = out[0].toTensor().size(2);
  c.out_w = out[0].toTensor().size(3);
}

// Observes this thread's ATen calls for its lifetime, into `calls`.
class TraceScope {
 public:
  explicit TraceScope(std::vector<ConvCall>& calls)
      : handle_(at::addThreadLocalCallback(at::RecordFunctionCallback(&on_enter, &on_exit)
                                               .needsInputs(true)
                                               .needsOutputs(true)
                                               .scopes({at::RecordScope::FUNCTION}))) {
    active_trace = &calls;
  }
  ~TraceScope() {
    active_trace = nullptr;
    at::removeCallback(handle_);
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  at::CallbackHandle handle_;
};

// The model's 4-D parameters, in named_parameters' order (the same on every rank).
std::vector<std::pair<std::string, at::Tensor>> four_d_parameters(kiln::Model& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters()) {
    if (item.value().dim() == 4) out.emplace_back(item.key(), item.value());
  }
  return out;
}

// Each 4-D weight NCHW where `nchw` says 1, else channels-last with to_channels_last's strides.
// Each parameter stays the same tensor object.
void lay_out(const std::vector<std::pair<std::string, at::Tensor>>& weights,
             const at::Tensor& nchw) {
  const auto* flags = nchw.const_data_ptr<int32_t>();
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& w = weights[i].second;
    if (flags[i] != 0) {
      restride(w, at::MemoryFormat::Contiguous);
    } else {
      restride_channels_last(w);
    }
  }
}

}  // namespace

std::vector<ConvCall> trace_convolutions(kiln::Model& model, const at::Tensor& sample) {
  std::vector<ConvCall> calls;
  const bool was_training = model.is_training();
  model.eval();
  try {
    at::NoGradGuard no_grad;
    const TraceScope scope(calls);
    model.forward(sample);
  } catch (...) {
    model.train(was_training);
    throw;
  }
  model.train(was_training);
  return calls;
}

bool blocked_nchw_is_faster(const ConvCall& call) {
  constexpr int64_t kMinChannels = 256;
  constexpr int64_t kMaxPixels = 16;
  return call.groups == 1 && call.kernel_h * call.kernel_w > 1 &&
         call.in_channels >= kMinChannels && call.out_h > 0 &&
         call.out_h * call.out_w <= kMaxPixels;
}

bool onednn_uses_avx512() {
  // oneDNN's cap on its instruction set (ONEDNN_MAX_CPU_ISA, or DNNL_ as before v3), if any.
  for (const char* name : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    const char* cap = std::getenv(name);
    if (cap == nullptr || *cap == '\0') continue;
    std::string upper(cap);
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (upper != "ALL" && upper.rfind("AVX512", 0) != 0 && upper.rfind("AVX10", 0) != 0) {
      return false;
    }
  }
  // avx512_core, oneDNN's baseline for its AVX-512 kernels.
  const auto caps = at::cpu::get_cpu_capabilities();
  for (const char* flag : {"avx512_f", "avx512_bw", "avx512_vl", "avx512_dq"}) {
    const auto it = caps.find(flag);
    if (it == caps.end() || !it->second.isBool() || !it->second.toBool()) return false;
  }
  return true;
}

NchwChoice keep_small_maps_nchw(kiln::Model& model, const at::Tensor& sample, bool avx512,
                                dist::ProcessGroup* group) {
  NchwChoice choice;
  const auto weights = four_d_parameters(model);
  // The 4-D parameter a call was given, or none (a weight the model computes).
  const auto weight_of = [&](const ConvCall& call) -> std::optional<size_t> {
    for (size_t i = 0; i < weights.size(); ++i) {
      if (weights[i].second.unsafeGetTensorImpl() == call.weight) return i;
    }
    return std::nullopt;
  };
  at::Tensor keep = at::zeros({static_cast<int64_t>(weights.size())}, at::kInt);
  if (avx512 && !weights.empty()) {
    try {
      at::Tensor picked = at::zeros_like(keep);
      for (const ConvCall& call : trace_convolutions(model, sample)) {
        const auto i = weight_of(call);
        if (i && blocked_nchw_is_faster(call)) picked.mutable_data_ptr<int32_t>()[*i] = 1;
      }
      if (picked.any().item<bool>()) {
        lay_out(weights, picked);
        // Kept only where the model then runs the convolution in NCHW: ATen runs one with an
        // NHWC input in NHWC whatever its weight's layout (a TorchScript module passes its input
        // on). A 1x1 convolution that gets an NCHW input from one of those goes NCHW too: ATen
        // runs it in its weight's layout if that is channels-last, reordering the input, and
        // its gradient comes back with the strides of the layout it ran in.
        for (const ConvCall& call : trace_convolutions(model, sample)) {
          const auto i = weight_of(call);
          if (!i || call.input_channels_last) continue;
          if (picked.const_data_ptr<int32_t>()[*i] == 1 || call.kernel_h * call.kernel_w == 1) {
            keep.mutable_data_ptr<int32_t>()[*i] = 1;
          }
        }
      }
    } catch (const std::exception& e) {
      keep.zero_();
      choice.trace_error = e.what();
    }
  }
  // Every rank must call the broadcast, whatever it found.
  if (group != nullptr && group->world_size() > 1) group->broadcast(keep, 0);
  lay_out(weights, keep);
  const auto* flags = keep.const_data_ptr<int32_t>();
  for (size_t i = 0; i < weights.size(); ++i) {
    if (flags[i] != 0) choice.names.push_back(weights[i].first);
  }
  return choice;
}

}  // namespace kiln::engine
