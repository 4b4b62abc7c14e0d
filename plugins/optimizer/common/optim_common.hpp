// Shared helpers of the built-in optimizer plugins (header-only; each plugin library compiles
// its own copy): option checks, reading a parameter group, host state tensors, grouping by
// device and dtype for multi-tensor ops (and by size for the fused kernels), and flat views for
// the fused kernels.
#ifndef KILN_PLUGINS_OPTIMIZER_COMMON_OPTIM_COMMON_HPP_
#define KILN_PLUGINS_OPTIMIZER_COMMON_OPTIM_COMMON_HPP_

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/where.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/calling_thread.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace kiln::optim {

// ---- options ------------------------------------------------------------------------------------

// Throws KILN_ERR_INVALID_ARGUMENT with "<component>: <message>".
[[noreturn]] inline void invalid(const std::string& component, const std::string& message) {
  throw Error(KILN_ERR_INVALID_ARGUMENT, component + ": " + message);
}

// A value for messages: shortest form ("0.9", "1e-08", "nan").
inline std::string number(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", value);
  return buf;
}

// Checks lo <= value (lo < value when lo_open) and value <= hi (value < hi when hi_open);
// infinite bounds are unchecked. The message names the option and the allowed interval.
inline void check_range(const std::string& component, const char* option, double value, double lo,
                        bool lo_open, double hi, bool hi_open) {
  const bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) &&
                  (hi_open ? value < hi : value <= hi);
  if (!ok) {
    const std::string interval = std::string(lo_open ? "(" : "[") + number(lo) + ", " +
                                 (std::isinf(hi) ? std::string("inf") : number(hi)) +
                                 (hi_open ? ")" : "]");
    invalid(component, std::string(option) + " must be in " + interval + ", got " + number(value));
  }
}

// ---- host services
// --------------------------------------------------------------------------------

// Turns a status a host service returned into an exception with its code and message.
inline void check_host(const kiln_host_api* host, kiln_status* status) {
  if (status == nullptr) return;
  Error error(host->status_code(status), host->status_message(status));
  host->free_status(status);
  throw error;
}

// One parameter of the group with its gradient, both as borrowed ATen views.
struct Param {
  size_t index;  // position in the group (the state_tensor index)
  at::Tensor param;
  at::Tensor grad;
};

// Reads and checks the group: lr and weight decay finite and >= 0, grads shaped and placed like
// their params, floating dtypes. Empty parameters are left out (nothing to update).
// Checks what every call must carry, whether or not its views are reused: the arrays, lr and
// weight decay finite and >= 0.
inline void check_group(const std::string& component, const kiln_param_group* group) {
  if (group == nullptr || group->struct_size < KILN_SIZE_UP_TO(kiln_param_group, weight_decay) ||
      (group->count > 0 && (group->params == nullptr || group->grads == nullptr))) {
    invalid(component, "step called without parameters or gradients");
  }
  if (!(std::isfinite(group->lr) && group->lr >= 0.0)) {
    invalid(component, "lr must be finite and >= 0, got " + number(group->lr));
  }
  if (!(std::isfinite(group->weight_decay) && group->weight_decay >= 0.0)) {
    invalid(component, "weight_decay must be finite and >= 0, got " + number(group->weight_decay));
  }
}

inline std::vector<Param> read_group(const std::string& component, const kiln_param_group* group) {
  check_group(component, group);
  std::vector<Param> out;
  out.reserve(group->count);
  for (size_t i = 0; i < group->count; ++i) {
    at::Tensor p = thread_view_cache().get(group->params[i]);
    at::Tensor g = thread_view_cache().get(group->grads[i]);
    if (p.sizes() != g.sizes() || p.device() != g.device()) {
      invalid(component, "gradient " + std::to_string(i) + " differs from its parameter in shape " +
                             "or device");
    }
    if (!at::isFloatingType(p.scalar_type()) || !at::isFloatingType(g.scalar_type())) {
      throw Error(KILN_ERR_UNSUPPORTED,
                  component + ": parameter " + std::to_string(i) + " is not floating point");
    }
    if (p.numel() == 0) continue;
    out.push_back({i, std::move(p), std::move(g)});
  }
  return out;
}

// The host's state tensors of one step call, checked against what `init` promises.
class StateStore {
 public:
  StateStore(const kiln_host_api* host, kiln_call_context* ctx) : host_(host), ctx_(ctx) {}

  at::Tensor get(const Param& p, const char* name, int32_t init, bool* created = nullptr) const {
    DLTensor view{};
    int32_t fresh = 0;
    check_host(host_, host_->state_tensor(ctx_, p.index, name, init, &view, &fresh));
    if (created != nullptr) *created = fresh != 0;
    at::Tensor t = thread_view_cache().get(view);
    bool ok = true;
    switch (init) {
      case KILN_STATE_ZEROS_LIKE_PARAM:
      case KILN_STATE_COPY_OF_GRAD:
        ok = t.sizes() == p.param.sizes() && t.device() == p.param.device() &&
             t.scalar_type() == p.param.scalar_type();
        break;
      case KILN_STATE_SCALAR_F64:
        ok = t.numel() == 1 && t.is_cpu() && t.scalar_type() == at::kDouble;
        break;
      case KILN_STATE_SCALAR_LIKE_PARAM:
        ok = t.dim() == 0 && t.device() == p.param.device() && t.scalar_type() == at::kFloat;
        break;
      default:
        break;
    }
    if (!ok) {
      throw Error(KILN_ERR_INTERNAL, std::string("host state tensor '") + name + "' of parameter " +
                                         std::to_string(p.index) + " has an unexpected layout");
    }
    return t;
  }

 private:
  const kiln_host_api* host_;
  kiln_call_context* ctx_;
};

// ---- capturable steps (ABI 1.4) --------------------------------------------------------------

// The device scalars of a capturable call (kiln/optimizer.h), both undefined for an eager one.
struct DeviceScalars {
  at::Tensor lr;         // 0-dim float32: the group's lr
  at::Tensor found_inf;  // 0-dim float32: nonzero when the step must change nothing
  bool defined() const { return lr.defined(); }
};

inline DeviceScalars device_scalars(const std::string& component, const kiln_param_group* group) {
  if (!KILN_HAS_FIELD(group, kiln_param_group, found_inf) || group->lr_tensor == nullptr) {
    return {};
  }
  if (group->found_inf == nullptr) invalid(component, "lr_tensor passed without found_inf");
  return {as_tensor(*group->lr_tensor), as_tensor(*group->found_inf)};
}

// The group's reuse_token, 0 (no promise) from a host before 1.4.
inline uint64_t reuse_token(const kiln_param_group* group) {
  return KILN_HAS_FIELD(group, kiln_param_group, reuse_token) ? group->reuse_token : 0;
}

// Capturable steps where no fused kernel takes found_inf: each target takes its updated value
// unless found_inf is set, decided on the device (a select, exact even where the update is NaN).
inline void assign_unless_found_inf(const std::vector<at::Tensor>& targets,
                                    const std::vector<at::Tensor>& updated,
                                    const at::Tensor& found_inf) {
  const at::Tensor skip = at::ne(found_inf, 0);
  for (size_t i = 0; i < targets.size(); ++i) {
    at::Tensor target = targets[i];  // a handle: copy_ writes the shared storage
    target.copy_(at::where(skip, target, updated[i]));
  }
}

// ---- grouping
// -------------------------------------------------------------------------------------

// Positions in `params` grouped by (device, dtype) in first-seen order: multi-tensor kernels
// take one device and dtype per call, as torch.optim groups them.
inline std::vector<std::vector<size_t>> by_device_and_dtype(const std::vector<Param>& params) {
  std::vector<std::pair<std::pair<at::Device, at::ScalarType>, std::vector<size_t>>> buckets;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto key = std::make_pair(params[i].param.device(), params[i].param.scalar_type());
    auto it = buckets.begin();
    while (it != buckets.end() && it->first != key) ++it;
    if (it == buckets.end()) {
      buckets.push_back({key, {}});
      it = buckets.end() - 1;
    }
    it->second.push_back(i);
  }
  std::vector<std::vector<size_t>> out;
  for (auto& b : buckets) out.push_back(std::move(b.second));
  return out;
}

// by_device_and_dtype, each bucket split further into the tensors a fused kernel steps with the
// intra-op team and those it steps on the calling thread (steps_on_calling_thread), in that
// order: one fused kernel call per bucket.
inline std::vector<std::vector<size_t>> fused_kernel_buckets(const std::vector<Param>& params) {
  std::vector<std::vector<size_t>> out;
  for (const auto& bucket : by_device_and_dtype(params)) {
    std::vector<size_t> team, inline_;
    for (size_t i : bucket)
      (steps_on_calling_thread(params[i].param) ? inline_ : team).push_back(i);
    if (!team.empty()) out.push_back(std::move(team));
    if (!inline_.empty()) out.push_back(std::move(inline_));
  }
  return out;
}

// ---- flat views
// -------------------------------------------------------------------------------------

// Whether `t` covers one dense block of memory with strides `strides` (size-1 dims ignored).
inline bool dense_with_strides(const at::Tensor& t, at::IntArrayRef strides) {
  if (!t.is_non_overlapping_and_dense()) return false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1 && t.stride(d) != strides[d]) return false;
  }
  return true;
}

inline std::vector<int64_t> row_major_strides(at::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = s;
    s *= std::max<int64_t>(sizes[d], 1);
  }
  return strides;
}

// The fused kernels walk each tensor's memory linearly, so a parameter and its gradient and
// state must share one dense layout. FlatViews hands out views over memory that already has the
// chosen layout and, for tensors that do not, staged copies in it; commit() writes the staged
// copies of writable tensors back. The CUDA kernels also want the tensors at one list position to
// have the same sizes (ForeachUtils.h, check_fast_path_restrictions), so every tensor flattened
// in one layout comes back alike: in the parameter's own shape when the layout is row-major,
// else 1-D.
class FlatViews {
 public:
  // The layout a parameter's tensors are flattened in: that of `reference` (the first state
  // tensor, whose layout the host chose) when dense, else the parameter's when dense, else
  // row-major.
  static std::vector<int64_t> layout_for(const at::Tensor& param, const at::Tensor& reference) {
    if (reference.defined() && reference.is_non_overlapping_and_dense()) {
      return reference.strides().vec();
    }
    if (param.is_non_overlapping_and_dense()) return param.strides().vec();
    return row_major_strides(param.sizes());
  }

  // `t` in `strides` order with dtype `dtype`: itself when row-major, else a 1-D view (a copy
  // when `t` has another layout or dtype, written back by commit() when `writable`).
  at::Tensor flat(const at::Tensor& t, at::IntArrayRef strides, at::ScalarType dtype,
                  bool writable) {
    if (t.scalar_type() == dtype && dense_with_strides(t, strides)) {
      // A contiguous tensor already is what the kernels walk; a new 1-D view of each of hundreds
      // of tensors per step would cost more than the small ones' updates.
      return t.is_contiguous() ? t : t.as_strided({t.numel()}, {1});
    }
    at::Tensor work = at::empty_strided(t.sizes(), strides, t.options().dtype(dtype));
    work.copy_(t);
    if (writable) staged_.emplace_back(t, work);
    // As the branch above returns a tensor already in this layout.
    return work.is_contiguous() ? work : work.as_strided({work.numel()}, {1});
  }

  void commit() {
    for (auto& [target, work] : staged_) target.copy_(work);
    staged_.clear();
  }
  // Whether copies wait for commit().
  bool staged() const { return !staged_.empty(); }

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> staged_;
};

// The kiln_capabilities every built-in optimizer declares: CPU and CUDA, the float types the
// ATen multi-tensor and fused kernels dispatch on, and whole-group calls.
constexpr uint64_t kOptimizerCaps = KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA |
                                    KILN_CAP_DTYPE_F32 | KILN_CAP_DTYPE_F16 | KILN_CAP_DTYPE_BF16 |
                                    KILN_CAP_DTYPE_F64 | KILN_CAP_MULTI_TENSOR;

}  // namespace kiln::optim

#endif  // KILN_PLUGINS_OPTIMIZER_COMMON_OPTIM_COMMON_HPP_
