// Shared pieces of the optimizer tests: optimizer configurations ("cases"), a deterministic
// set of parameters and gradient sequences, a driver that steps an optimizer plugin through
// them with the fake host, and the relative error the comparisons use.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "fake_host.hpp"

namespace kiln::test {

// The optimizer vtable of `component` in built-in `library`; throws when absent.
const kiln_optimizer_vtable& optimizer_vtable(const std::string& library,
                                              const std::string& component);

// One option as given to the plugin and to the Python oracle.
struct OptionValue {
  std::string name;
  bool is_bool;
  double value;  // 0/1 for booleans
};

// One optimizer configuration.
struct Case {
  std::string name;       // unique; prefixes the oracle's files
  std::string library;    // "kiln_adam"
  std::string component;  // "adamw"
  std::vector<OptionValue> options;
  double weight_decay;
  double base_lr;  // step s (0-based) runs at base_lr * (1 - 0.004 s)
};

// The configurations of one optimizer family ("sgd", "rmsprop", "adam", "adamw", "lamb") that
// the oracle test compares with torch.
std::vector<Case> cases_for(const std::string& family);

// Options view of a case.
Options options_of(const Case& c);
// The learning rate of 0-based step `s`.
double lr_at(const Case& c, int64_t s);
// The case as a JSON object for the oracle script.
std::string case_json(const Case& c, int64_t steps);

// Initial values (contiguous float32 on CPU) and gradient sequences ([steps, shape...]).
struct Trajectory {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<at::Tensor> initial;
  std::vector<at::Tensor> grads;
  int64_t steps = 0;
};
// A matrix, a 4-D conv weight, a vector, a one-element tensor, a matrix that the parameter set
// holds as a strided (non-dense) view, and a 40x1000 matrix (large enough for the fused kernels'
// intra-op team); values from at::randn under `seed`.
Trajectory make_trajectory(int64_t steps, uint64_t seed);

// Parameters as a host may hand them over: parameter 0 a transposed (dense, non-contiguous)
// matrix, parameter 4 every other column of `base` (non-dense); the others contiguous.
struct ParamSet {
  std::vector<at::Tensor> params;
  at::Tensor base;  // storage of parameter 4; its odd columns must never change
  static constexpr double kFiller = 7.0;  // value of base's odd columns
};
ParamSet make_params(const Trajectory& t, at::Device device, at::ScalarType dtype = at::kFloat);

// How run_steps calls the plugin (ABI 1.4 fields); the default is an eager call with no promise.
struct CallMode {
  uint64_t reuse_token = 0;     // passed on every call
  bool device_scalars = false;  // capturable calls: lr_tensor and found_inf on the params' device
  double found_inf = 0.0;       // the flag's value in those calls
  // When set: each step's gradients are copied into these tensors (one per parameter, any
  // layout) and handed over from there, the same memory every call, as the host's allocator
  // gives a step the blocks of the step before. Borrowed.
  const std::vector<at::Tensor>* grad_memory = nullptr;
};

// Runs steps [first, first + count) of `c` on `params` (updated in place) with grads[i][step] of
// the chosen parameters; "" on success, else the plugin's status.
std::string run_steps(const kiln_optimizer_vtable& vt, void* instance, kiln_call_context& ctx,
                      const Case& c, const std::vector<at::Tensor>& params,
                      const std::vector<at::Tensor>& grads, int64_t first, int64_t count,
                      const CallMode& mode = {});

// max |a - b| / max(1, max |b|), in float64 on the CPU.
double relative_error(const at::Tensor& actual, const at::Tensor& expected);

// An optimizer instance destroyed with its scope.
class Instance {
 public:
  Instance(const kiln_optimizer_vtable& vt, Options& options);
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  void* get() const { return instance_; }
  const std::string& error() const { return error_; }  // create's status, "" on success

 private:
  const kiln_optimizer_vtable& vt_;
  void* instance_ = nullptr;
  std::string error_;
};

}  // namespace kiln::test
