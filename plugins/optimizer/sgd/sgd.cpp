// kiln_sgd — the "sgd" optimizer: torch.optim.SGD's update (momentum, dampening, Nesterov,
// weight decay), applied in place on the host's parameter views with ATen.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>

#include <memory>
#include <string>

#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

struct Sgd {
  const kiln_host_api* host;
  double momentum;
  double dampening;
  bool nesterov;
};

// One parameter's update, in torch.optim.SGD's order of operations so results match it to the
// rounding. Without momentum, weight decay is folded into in-place ops; with momentum it needs
// d_p = grad + wd * param (as torch does), which is then reused in place for Nesterov. Returns
// the host's status when it cannot provide the momentum buffer (passed back unchanged).
kiln_status* update(const Sgd& sgd, kiln_call_context* ctx, size_t i, at::Tensor param,
                    const at::Tensor& grad, double lr, double wd) {
  const double m = sgd.momentum;
  if (m == 0.0) {
    // p -= lr * (g + wd * p)
    if (wd != 0.0) param.mul_(1.0 - lr * wd);
    param.add_(grad, -lr);
    return nullptr;
  }
  DLTensor view{};
  int32_t created = 0;
  if (kiln_status* status = sgd.host->state_tensor(ctx, i, "momentum_buffer",
                                                   KILN_STATE_ZEROS_LIKE_PARAM, &view, &created)) {
    return status;
  }
  at::Tensor buf = kiln::as_tensor(view);
  const bool own_d_p = wd != 0.0;
  at::Tensor d_p = own_d_p ? at::add(grad, param, wd) : grad;
  if (created) {
    // torch.optim.SGD starts the buffer at d_p itself, without dampening.
    buf.copy_(d_p);
  } else {
    buf.mul_(m).add_(d_p, 1.0 - sgd.dampening);
  }
  if (sgd.nesterov) {
    // p -= lr * (d_p + m * buf); buf already holds the new value.
    if (own_d_p) {
      d_p.add_(buf, m);
    } else {
      d_p = at::add(grad, buf, m);
    }
    param.add_(d_p, -lr);
  } else {
    param.add_(buf, -lr);
  }
  return nullptr;
}

kiln_status* sgd_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto sgd = std::make_unique<Sgd>();
    sgd->host = host;
    sgd->momentum = kiln_options_float(options, "momentum", 0.9);
    sgd->dampening = kiln_options_float(options, "dampening", 0.0);
    sgd->nesterov = kiln_options_bool(options, "nesterov", 0) != 0;
    if (!(sgd->momentum >= 0.0 && sgd->momentum < 1.0)) {
      throw kiln::Error(KILN_ERR_INVALID_ARGUMENT,
                        "sgd: momentum must be in [0, 1), got " + std::to_string(sgd->momentum));
    }
    if (!(sgd->dampening >= 0.0 && sgd->dampening <= 1.0)) {
      throw kiln::Error(KILN_ERR_INVALID_ARGUMENT,
                        "sgd: dampening must be in [0, 1], got " + std::to_string(sgd->dampening));
    }
    if (sgd->nesterov && (sgd->momentum <= 0.0 || sgd->dampening != 0.0)) {
      throw kiln::Error(KILN_ERR_INVALID_ARGUMENT,
                        "sgd: nesterov requires momentum > 0 and dampening = 0 (momentum " +
                            std::to_string(sgd->momentum) + ", dampening " +
                            std::to_string(sgd->dampening) + ")");
    }
    *out = sgd.release();
  });
}

void sgd_destroy(void* instance) { delete static_cast<Sgd*>(instance); }

kiln_status* sgd_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Sgd& sgd = *static_cast<const Sgd*>(instance);
  kiln_status* host_status = nullptr;
  kiln_status* status = KILN_GUARD(sgd.host, {
    for (size_t i = 0; i < group->count && host_status == nullptr; ++i) {
      host_status = update(sgd, ctx, i, kiln::as_tensor(group->params[i]),
                           kiln::as_tensor(group->grads[i]), group->lr, group->weight_decay);
    }
  });
  return status != nullptr ? status : host_status;
}

const kiln_optimizer_vtable kVtable = {sizeof(kiln_optimizer_vtable), sgd_create, sgd_destroy,
                                       sgd_step};

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "momentum", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.9", nullptr,
     "momentum factor, in [0, 1)"},
    {sizeof(kiln_option_spec), "dampening", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.0", nullptr,
     "dampening applied to the gradient added to the momentum buffer"},
    {sizeof(kiln_option_spec), "nesterov", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "false", nullptr,
     "Nesterov momentum (needs momentum > 0 and dampening = 0)"},
};

const kiln_capabilities kCaps = {sizeof(kiln_capabilities),
                                 KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32 |
                                     KILN_CAP_DTYPE_F16 | KILN_CAP_DTYPE_BF16 |
                                     KILN_CAP_MULTI_TENSOR,
                                 0, nullptr};

const kiln_component_descriptor kSgd = {sizeof(kiln_component_descriptor),
                                        KILN_COMPONENT_OPTIMIZER,
                                        0,
                                        "sgd",
                                        {1, 0, 0},
                                        "stochastic gradient descent as torch.optim.SGD",
                                        &kCaps,
                                        sizeof(kOptions) / sizeof(kOptions[0]),
                                        kOptions,
                                        &kVtable};

const kiln_component_descriptor* const kComponents[] = {&kSgd};

const kiln_plugin_descriptor kDescriptor = {sizeof(kiln_plugin_descriptor),
                                            KILN_ABI_MAJOR,
                                            KILN_ABI_MINOR,
                                            "kiln-sgd",
                                            {1, 0, 0},
                                            1,
                                            kComponents,
                                            nullptr,
                                            nullptr,
                                            -1,
                                            0};

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
