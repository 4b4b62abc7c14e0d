#include "test_norm.hpp"

#include <ATen/Functions.h>

namespace kiln_test {
namespace {

kiln_status* create_norm_layer(const kiln_norm_request* request, kiln_torch_module** out) {
  norm_requests().push_back(*request);
  if (fail_norm_layers()) return kiln::test::make_status(KILN_ERR_INTERNAL, "norm layers disabled");
  *out = kiln::release_norm_layer(std::make_shared<TestNorm>(
      request->num_features, request->activation, request->activation_param));
  return nullptr;
}

}  // namespace

const kiln_host_api* model_host() {
  kiln::test::set_norm_layer_hook(&create_norm_layer);
  return kiln::test::fake_host();
}

std::vector<kiln_norm_request>& norm_requests() {
  static std::vector<kiln_norm_request> requests;
  return requests;
}

bool& fail_norm_layers() {
  static bool fail = false;
  return fail;
}

TestNorm::TestNorm(int64_t features, int32_t activation, double activation_param)
    : activation_(activation), activation_param_(activation_param) {
  weight_ = register_parameter("weight", at::ones({features}));
  bias_ = register_parameter("bias", at::zeros({features}));
}

at::Tensor TestNorm::forward(const at::Tensor& input) {
  at::Tensor y = at::batch_norm(input, weight_, bias_, {}, {}, /*training=*/true, 0.1, 1e-5,
                                /*cudnn_enabled=*/false);
  switch (activation_) {
    case KILN_ACT_RELU:
      return at::relu(y);
    case KILN_ACT_LEAKY_RELU:
      return at::leaky_relu(y, activation_param_);
    case KILN_ACT_ELU:
      return at::elu(y, activation_param_);
    default:
      return y;
  }
}

}  // namespace kiln_test
