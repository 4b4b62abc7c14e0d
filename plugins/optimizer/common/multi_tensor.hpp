// Shared pieces of the built-in optimizers that follow torch.optim's _multi_tensor_* paths over
// ATen's _foreach ops (header-only, beside optim_common.hpp): a bucket's tensor lists, the host
// values of 0-dim state tensors (the per-parameter "step" and the like, which torch's
// non-capturable paths read with .item()), scalar lists, and a few option and descriptor helpers.
#ifndef KILN_PLUGINS_OPTIMIZER_COMMON_MULTI_TENSOR_HPP_
#define KILN_PLUGINS_OPTIMIZER_COMMON_MULTI_TENSOR_HPP_

#include <ATen/core/Tensor.h>
#include <ATen/ops/stack.h>

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "common/optim_common.hpp"

namespace kiln::optim {

// The parameters of one bucket (by_device_and_dtype) and their gradients, the gradients in the
// parameters' dtype; `index` holds each one's position in the group's Param list.
struct BucketLists {
  std::vector<size_t> index;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> grads;
};

inline BucketLists bucket_lists(const std::vector<Param>& params,
                                const std::vector<size_t>& bucket) {
  BucketLists out;
  for (size_t k : bucket) {
    const Param& p = params[k];
    out.index.push_back(k);
    out.params.push_back(p.param);
    out.grads.push_back(
        p.grad.scalar_type() == p.param.scalar_type() ? p.grad : p.grad.to(p.param.scalar_type()));
  }
  return out;
}

// The entries of `all` at the positions `at` (a bucket's share of a per-parameter list).
template <typename T>
std::vector<T> pick(const std::vector<T>& all, const std::vector<size_t>& at) {
  std::vector<T> out;
  out.reserve(at.size());
  for (size_t k : at) out.push_back(all[k]);
  return out;
}

// The values of 0-dim tensors on the host, in order, as torch's _get_value reads them: .item()
// of each CPU tensor, one stacked copy for those on a device (one synchronisation per call).
inline std::vector<double> host_values(const std::vector<at::Tensor>& scalars) {
  std::vector<double> out(scalars.size());
  std::vector<at::Tensor> on_device;
  std::vector<size_t> where;
  for (size_t i = 0; i < scalars.size(); ++i) {
    if (scalars[i].is_cpu()) {
      out[i] = scalars[i].item<double>();
    } else {
      on_device.push_back(scalars[i].reshape({}).to(at::kDouble));
      where.push_back(i);
    }
  }
  if (!on_device.empty()) {
    const at::Tensor values = at::stack(on_device).cpu().contiguous();
    const double* v = values.data_ptr<double>();
    for (size_t j = 0; j < where.size(); ++j) out[where[j]] = v[j];
  }
  return out;
}

// A list of ATen scalars for the _foreach ops' per-tensor (ScalarList) overloads.
inline std::vector<at::Scalar> scalar_list(const std::vector<double>& values) {
  return std::vector<at::Scalar>(values.begin(), values.end());
}

// torch.finfo(dtype).eps of a floating dtype.
inline double dtype_eps(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return 0.0009765625;  // 2^-10
    case at::kBFloat16:
      return 0.0078125;  // 2^-7
    case at::kDouble:
      return std::numeric_limits<double>::epsilon();
    default:
      return std::numeric_limits<float>::epsilon();
  }
}

// A 0-dim float32 state tensor (KILN_STATE_SCALAR_LIKE_PARAM) that torch creates with a value
// other than zero: set to `value` when the host has just created it.
inline at::Tensor scalar_state(const StateStore& state, const Param& p, const char* name,
                               double value) {
  bool created = false;
  at::Tensor t = state.get(p, name, KILN_STATE_SCALAR_LIKE_PARAM, &created);
  if (created && value != 0.0) t.fill_(value);
  return t;
}

// A state tensor shaped like the parameter (KILN_STATE_ZEROS_LIKE_PARAM) that torch creates
// filled with `value` (torch.full_like).
inline at::Tensor full_state(const StateStore& state, const Param& p, const char* name,
                             double value) {
  bool created = false;
  at::Tensor t = state.get(p, name, KILN_STATE_ZEROS_LIKE_PARAM, &created);
  if (created && value != 0.0) t.fill_(value);
  return t;
}

}  // namespace kiln::optim

#endif  // KILN_PLUGINS_OPTIMIZER_COMMON_MULTI_TENSOR_HPP_
