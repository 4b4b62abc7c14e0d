// signum — an out-of-tree optimizer in C++ over LibTorch's ATen, built against the installed Kiln
// SDK: Signum (signSGD with momentum, Bernstein et al. 2018) with decoupled weight decay:
//
//   m ← β·m + (1 − β)·g          (state "momentum", kept and checkpointed by the host)
//   p ← p·(1 − lr·wd) − lr·sign(m)
//
// Every step's tensors are borrowed DLTensor views; kiln::as_tensor wraps them without copying.
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "kiln/optimizer.h"
#include "kiln/plugin.h"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

struct Signum {
  const kiln_host_api* host;  // valid for the life of the process
  double beta;
};

kiln_status* create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto s = std::make_unique<Signum>();
    s->host = host;
    s->beta = kiln_options_float(options, "beta", 0.9);  // validated: in [0, 1)
    *out = s.release();
  });
}

void destroy(void* instance) { delete static_cast<Signum*>(instance); }

kiln_status* step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Signum& s = *static_cast<const Signum*>(instance);
  return KILN_GUARD(s.host, {
    for (size_t i = 0; i < group->count; ++i) {
      at::Tensor p = kiln::as_tensor(group->params[i]);
      at::Tensor g = kiln::as_tensor(group->grads[i]);
      DLTensor m_view{};
      if (kiln_status* st = s.host->state_tensor(ctx, i, "momentum", KILN_STATE_ZEROS_LIKE_PARAM,
                                                 &m_view, nullptr)) {
        // Carried out as an exception with the host's code and message; KILN_GUARD turns it
        // back into a status.
        kiln::Error error(s.host->status_code(st), s.host->status_message(st));
        s.host->free_status(st);
        throw error;
      }
      at::Tensor m = kiln::as_tensor(m_view);
      m.mul_(s.beta).add_(g, 1.0 - s.beta);
      if (group->weight_decay != 0.0) p.mul_(1.0 - group->lr * group->weight_decay);
      p.add_(m.sign(), -group->lr);
    }
  });
}

const kiln_optimizer_vtable kVtable = KILN_OPTIMIZER_VTABLE_INIT(create, destroy, step);

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "beta", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 0.999, "0.9", nullptr,
     "momentum coefficient of the gradient average whose sign is applied"}};

const kiln_capabilities kCaps = {
    sizeof(kiln_capabilities),
    KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32 | KILN_CAP_DTYPE_BF16, 0,
    nullptr};

const kiln_component_descriptor kComponent = {sizeof(kiln_component_descriptor),
                                              KILN_COMPONENT_OPTIMIZER,
                                              0,
                                              "signum",
                                              {1, 0, 0},
                                              "signSGD with momentum (an out-of-tree example)",
                                              &kCaps,
                                              sizeof(kOptions) / sizeof(kOptions[0]),
                                              kOptions,
                                              &kVtable};

const kiln_component_descriptor* const kComponents[] = {&kComponent};

// ATen stays inside the library (only DLTensor views cross), so no torch version is recorded.
const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("example-signum", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
