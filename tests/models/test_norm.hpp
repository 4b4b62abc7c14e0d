// The model tests' norm layer: the common fake host, with create_norm_layer building batch norm
// from at::batch_norm (training mode) followed by the requested activation.
#pragma once

#include <cstdint>
#include <vector>

#include "fake_host.hpp"
#include "kiln/torch.hpp"

namespace kiln_test {

using StatusPtr = kiln::test::Status;

// The fake host with the norm layers below installed.
const kiln_host_api* model_host();

// Every kiln_norm_request the fake host received, in order.
std::vector<kiln_norm_request>& norm_requests();

// When true, create_norm_layer fails (to test how models pass the failure on).
bool& fail_norm_layers();

// Batch norm with its own affine parameters (ones/zeros), batch statistics always, then the
// activation.
class TestNorm : public kiln::NormLayer {
 public:
  TestNorm(int64_t features, int32_t activation, double activation_param);
  at::Tensor forward(const at::Tensor& input) override;

 private:
  at::Tensor weight_;
  at::Tensor bias_;
  int32_t activation_;
  double activation_param_;
};

}  // namespace kiln_test
