// Calling a norm plugin's vtable directly: creating a layer from options as the host does,
// one forward or backward on at::Tensors with the host-owned tensors kept per rank, and the
// closeness check the tests share.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "host_base.hpp"
#include "kiln/torch.hpp"
#include "options.hpp"
#include "thread_host.hpp"

namespace kiln::norm_test {

// The vtable and descriptor of built-in `component` in `library`.
const kiln_norm_vtable& vtable(const std::string& library, const std::string& component);
const kiln_component_descriptor& descriptor(const std::string& library,
                                            const std::string& component);

// One created layer (destroyed with the object).
struct Layer {
  const kiln_norm_vtable* vt = nullptr;
  void* instance = nullptr;
  kiln_norm_layout layout{};
  Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;
  ~Layer();
};

// Creates a layer of `component` (options completed with the schema defaults, as the host
// does). `device_type`: kiln_norm_setup.device_type (ABI 1.9), 0 (unknown) unless a test picks
// a device. Returns the plugin's status ("" on success).
std::string create(Layer& layer, const std::string& library, const std::string& component,
                   test::Options& options, int64_t channels, int32_t activation = KILN_ACT_NONE,
                   double activation_param = 0.0, int32_t device_type = 0);

// The host-owned tensors of one layer on one rank (undefined ones are passed as NULL).
struct State {
  at::Tensor weight, bias, running_mean, running_var, save_mean, save_invstd;
};
// Initial state as the host allocates it: weight/bias from `w`/`b` (undefined: none), running
// statistics 0 / 1, save buffers [C] float32, all on `device`.
State make_state(int64_t channels, const at::Tensor& w, const at::Tensor& b, at::Device device);

// One forward: `output` may be the same tensor as `input` (in-place layers). Returns the
// status description ("" on success).
std::string forward(const Layer& layer, kiln_call_context* ctx, bool training,
                    const at::Tensor& input, const at::Tensor& output, State& state);

// What a training forward reported to a host that updates the running statistics itself
// (ABI 1.5, kiln_norm_forward_args.batch_stats).
struct Report {
  at::Tensor mean, var;  // [C] float32
  double count = 0, momentum = 0;
  int32_t reported = 0;
};
// One training forward as such a host calls it: no running statistics, a report to fill.
// `args_size` is the struct_size the host claims for its arguments (an older host's is smaller
// and has no batch_stats, though the field is set).
std::string forward_reporting(const Layer& layer, kiln_call_context* ctx, const at::Tensor& input,
                              const at::Tensor& output, State& state, Report& report,
                              size_t args_size = sizeof(kiln_norm_forward_args));

struct Grads {
  at::Tensor input, weight, bias;
};
// One backward; `saved` undefined passes NULL; gradients are allocated for the defined
// parameters unless `frozen`.
std::string backward(const Layer& layer, kiln_call_context* ctx, bool training,
                     const at::Tensor& grad_output, const at::Tensor& saved, State& state,
                     Grads& grads, bool frozen = false);

// EXPECT that max |a - e| / (atol + rtol |e|) <= 1.
void expect_close(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol,
                  const std::string& what);

}  // namespace kiln::norm_test
