// A fake kiln_host_api for model tests: statuses, logging, and a norm layer built from
// at::batch_norm (training mode) followed by the requested activation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/torch.hpp"

// The test is the host here, so it defines the opaque status.
struct kiln_status {
  int32_t code;
  std::string message;
};

namespace kiln_test {

struct StatusDeleter {
  void operator()(kiln_status* status) const { delete status; }
};
using StatusPtr = std::unique_ptr<kiln_status, StatusDeleter>;

// The host table; its norm layers record their requests in norm_requests().
const kiln_host_api* fake_host();

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
