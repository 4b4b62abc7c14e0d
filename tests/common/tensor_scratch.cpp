#include "tensor_scratch.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>

#include <stdexcept>

namespace kiln::test {

void TensorScratch::write(const std::string& name, const at::Tensor& t) const {
  at::Tensor c = t.detach().cpu().contiguous();
  write_bytes(name, c.data_ptr(), c.nbytes());
}

at::Tensor TensorScratch::read(const std::string& name, at::IntArrayRef shape,
                               at::ScalarType dtype) const {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
  read_bytes(name, t.data_ptr(), t.nbytes());
  return t;
}

double closeness(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol) {
  at::Tensor a = actual.detach().cpu().to(at::kDouble);
  at::Tensor e = expected.detach().cpu().to(at::kDouble);
  if (a.sizes() != e.sizes()) throw std::runtime_error("closeness: shapes differ");
  return ((a - e).abs() / (e.abs() * rtol + atol)).max().item<double>();
}

}  // namespace kiln::test
