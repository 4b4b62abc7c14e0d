// The tests' fake kiln_host_api for calling plugin vtables directly: statuses that keep code and
// message, state tensors in a map created as host/plugin/host_api.cpp creates them (every
// KILN_STATE_* kind), an injectable state failure, a single-process "process group", and an
// optional norm-layer factory for model tests.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "host_base.hpp"
#include "kiln/sdk.hpp"
#include "options.hpp"

// The test's own definition of the host's per-call context.
struct kiln_call_context {
  std::vector<at::Tensor> params;  // the group's parameters, for *_LIKE_PARAM state
  std::vector<at::Tensor> grads;   // the group's gradients, for KILN_STATE_COPY_OF_GRAD
  std::map<std::pair<size_t, std::string>, at::Tensor> state;
  std::map<std::pair<size_t, std::string>, int32_t> state_init;  // the init kind each asked for
  // state_tensor answers KILN_ERR_OUT_OF_MEMORY for parameters from this index on.
  size_t fail_state_from = SIZE_MAX;
};

namespace kiln::test {

// The fake host's services table (process-wide, like the real one).
const kiln_host_api* fake_host();

// What the host's create_norm_layer does; without one it answers KILN_ERR_UNSUPPORTED.
using NormLayerHook = kiln_status* (*)(const kiln_norm_request* request, kiln_torch_module** out);
void set_norm_layer_hook(NormLayerHook hook);

}  // namespace kiln::test
