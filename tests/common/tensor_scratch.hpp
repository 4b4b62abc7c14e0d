// The oracle's scratch directory with tensors as its raw arrays.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "scratch.hpp"

namespace kiln::test {

class TensorScratch : public Scratch {
 public:
  using Scratch::read_text;
  using Scratch::write_text;

  // Writes `t` (any layout, any device) as raw contiguous values of its dtype to `name`.
  void write(const std::string& name, const at::Tensor& t) const;
  // Reads `name` as `dtype` values shaped `shape`; throws when absent or of another size.
  at::Tensor read(const std::string& name, at::IntArrayRef shape,
                  at::ScalarType dtype = at::kFloat) const;
};

// Max |a - e| / (atol + rtol * |e|) over all elements: <= 1 means close.
double closeness(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol);

}  // namespace kiln::test
