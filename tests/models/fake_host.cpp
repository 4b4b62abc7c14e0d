#include "fake_host.hpp"

#include <ATen/Functions.h>

#include <cstdio>

namespace kiln_test {
namespace {

kiln_status* make_status(int32_t code, const char* message) {
  return new kiln_status{code, message != nullptr ? message : ""};
}

void log(int32_t level, const char* component, const char* message) {
  std::fprintf(stderr, "[%d] %s: %s\n", level, component, message);
}

kiln_status* create_norm_layer(const kiln_norm_request* request, kiln_torch_module** out) {
  norm_requests().push_back(*request);
  if (fail_norm_layers()) return make_status(KILN_ERR_INTERNAL, "norm layers disabled");
  *out = kiln::release_norm_layer(std::make_shared<TestNorm>(
      request->num_features, request->activation, request->activation_param));
  return nullptr;
}

int32_t status_code(const kiln_status* status) { return status->code; }
const char* status_message(const kiln_status* status) { return status->message.c_str(); }
void free_status(kiln_status* status) { delete status; }

kiln_host_api make_host() {
  kiln_host_api host{};
  host.struct_size = sizeof(host);
  host.abi_major = KILN_ABI_MAJOR;
  host.abi_minor = KILN_ABI_MINOR;
  host.make_status = &make_status;
  host.log = &log;
  host.create_norm_layer = &create_norm_layer;
  host.status_code = &status_code;
  host.status_message = &status_message;
  host.free_status = &free_status;
  return host;
}

}  // namespace

const kiln_host_api* fake_host() {
  static const kiln_host_api host = make_host();
  return &host;
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
