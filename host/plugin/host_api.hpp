// The process-wide kiln_host_api table the host passes to plugins, and the context objects
// behind kiln_call_context.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/host.h"

namespace kiln {
class NormLayer;
namespace dist {
class ProcessGroup;
}
}  // namespace kiln

namespace kiln::plugin {

// One parameter's optimizer state tensors by state name ("momentum_buffer"); std::less<> so a
// plugin's const char* name is looked up without building a string.
using ParamState = std::map<std::string, at::Tensor, std::less<>>;
// Optimizer state tensors, keyed by parameter name then state name, owned by the host so
// checkpoints can save them without knowing the plugin.
using StateStore = std::map<std::string, ParamState>;

}  // namespace kiln::plugin

// What a kiln_call_context* points to. Filled by an adapter for one call.
struct kiln_call_context {
  const std::vector<at::Tensor>* params = nullptr;  // optimizer calls: the group's parameters
  // optimizer calls: each parameter's entry of the adapter's StateStore (same positions)
  const std::vector<kiln::plugin::ParamState*>* state = nullptr;
  kiln::dist::ProcessGroup* group = nullptr;  // collectives: NULL for a single process
};

namespace kiln::plugin {

// The table handed to plugins; valid for the life of the process.
const kiln_host_api* host_api();

// Builds the pipeline's norm layer for a model's request (set by the engine before it creates
// the model; cleared after). Used by kiln_host_api.create_norm_layer.
using NormFactory = std::function<std::shared_ptr<kiln::NormLayer>(const kiln_norm_request&)>;
void set_norm_factory(NormFactory factory);

// The run's process group, behind the collectives (rank, world_size, allreduce, broadcast,
// allgather) of optimizer and norm-layer calls; nullptr (the default) for a single process.
// Set by the engine for the length of a distributed run.
void set_collective_group(kiln::dist::ProcessGroup* group);
kiln::dist::ProcessGroup* collective_group();

}  // namespace kiln::plugin
