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
#include "kiln/optimizer.h"

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

namespace kiln::plugin {

// Builds the run's norm layer for a model's request (model_build: the pipeline's norm plugin).
using NormFactory = std::function<std::shared_ptr<kiln::NormLayer>(const kiln_norm_request&)>;

}  // namespace kiln::plugin

// What a kiln_call_context* points to. Filled by an adapter for one call; what a run owns (its
// process group, its norm plugin) reaches plugins only through it.
struct kiln_call_context {
  const std::vector<at::Tensor>* params = nullptr;  // optimizer calls: the group's parameters
  // optimizer calls: each parameter's entry of the adapter's StateStore (same positions)
  const std::vector<kiln::plugin::ParamState*>* state = nullptr;
  kiln::dist::ProcessGroup* group = nullptr;  // collectives: NULL for a single process
  // model create calls: the run's norm layers (create_norm_layer_in); NULL elsewhere
  const kiln::plugin::NormFactory* norm_factory = nullptr;
  // a wrapper's step calls (ABI 1.14): the inner optimizer's step on this group's parameters
  // (inner_step); NULL elsewhere
  const std::function<void(const kiln_param_group&)>* inner_step = nullptr;
  // step_all's own ctx (ABI 1.14): the step's re-evaluation (reevaluate); NULL elsewhere
  const std::function<kiln_reevaluation()>* reevaluate = nullptr;
};

namespace kiln::plugin {

// The table handed to plugins; valid for the life of the process, and the same for every run:
// it holds no run's state.
const kiln_host_api* host_api();

// Binds `ctx` to the calling thread for the length of one model create call, for models built
// before ABI 1.6, which ask through create_norm_layer(request, out) without a context: that
// slot reaches the innermost binding of its own thread, never another run's. Nests.
class ModelCreateBinding {
 public:
  explicit ModelCreateBinding(kiln_call_context* ctx);
  ~ModelCreateBinding();
  ModelCreateBinding(const ModelCreateBinding&) = delete;
  ModelCreateBinding& operator=(const ModelCreateBinding&) = delete;

 private:
  kiln_call_context* previous_;
};

}  // namespace kiln::plugin
