// kiln_sgd — the "sgd" optimizer: torch.optim.SGD's update (momentum, dampening, Nesterov,
// weight decay) over the whole group per call: ATen's fused SGD kernel for parameters whose
// momentum buffer shares their dense layout, the multi-tensor (_foreach) ops for the rest (and
// for float16/bfloat16 on the CPU).
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_fused_sgd.h>

#include <memory>
#include <string>
#include <vector>

#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

using kiln::optim::Param;

struct Sgd {
  const kiln_host_api* host;
  double momentum;
  double dampening;
  bool nesterov;
};

// Tensors of one kernel call: same device and dtype, and the same "first step" state.
struct Batch {
  std::vector<at::Tensor> params, grads, bufs;
  bool first = false;
};

void run_fused(const Sgd& sgd, const Batch& b, double lr, double wd) {
  if (b.params.empty()) return;
  // With momentum 0 the kernel takes no buffers at all.
  at::_fused_sgd_(b.params, b.grads, b.bufs, wd, sgd.momentum, lr, sgd.dampening, sgd.nesterov,
                  /*maximize=*/false, /*is_first_step=*/b.first);
}

// torch.optim.SGD's _multi_tensor_sgd, op for op.
void run_foreach(const Sgd& sgd, const Batch& b, double lr, double wd) {
  if (b.params.empty()) return;
  std::vector<at::Tensor> d_p = wd != 0.0 ? at::_foreach_add(b.grads, b.params, wd) : b.grads;
  if (sgd.momentum != 0.0) {
    if (b.first) {
      // torch starts the buffer at d_p itself, without dampening.
      at::_foreach_copy_(b.bufs, d_p);
    } else {
      at::_foreach_mul_(b.bufs, sgd.momentum);
      at::_foreach_add_(b.bufs, d_p, 1.0 - sgd.dampening);
    }
    if (sgd.nesterov) {
      if (wd != 0.0) {
        at::_foreach_add_(d_p, b.bufs, sgd.momentum);
      } else {
        d_p = at::_foreach_add(b.grads, b.bufs, sgd.momentum);
      }
    } else {
      d_p = b.bufs;
    }
  }
  at::_foreach_add_(b.params, d_p, -lr);
}

void sgd_update(const Sgd& sgd, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group("sgd", group);
  const kiln::optim::StateStore state(sgd.host, ctx);
  kiln::optim::FlatViews flat;
  const bool with_momentum = sgd.momentum != 0.0;
  // All state first, so that a host failure leaves every parameter untouched.
  std::vector<at::Tensor> bufs(params.size());
  std::vector<bool> created(params.size(), false);
  for (size_t k = 0; with_momentum && k < params.size(); ++k) {
    bool fresh = false;
    bufs[k] = state.get(params[k], "momentum_buffer", KILN_STATE_ZEROS_LIKE_PARAM, &fresh);
    created[k] = fresh;
  }
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    // [fused?][first step?]
    Batch batches[2][2];
    batches[0][1].first = batches[1][1].first = true;
    for (size_t k : bucket) {
      const Param& p = params[k];
      const at::Tensor& buf = bufs[k];
      const at::ScalarType dtype = p.param.scalar_type();
      // The fused kernel walks memory linearly: usable when param and buffer share a dense layout.
      // Not for half types on the CPU, whose vectorised fused loop skips updates in torch 2.11
      // (pytorch/pytorch#191763).
      const bool fused =
          (p.param.is_cuda() || dtype == at::kFloat || dtype == at::kDouble) &&
          p.param.is_non_overlapping_and_dense() &&
          (!with_momentum || kiln::optim::dense_with_strides(buf, p.param.strides()));
      Batch& b = batches[fused ? 1 : 0][created[k] ? 1 : 0];
      if (b.params.empty()) {
        // Room for the whole bucket at once: a step then grows no vector one by one.
        b.params.reserve(bucket.size());
        b.grads.reserve(bucket.size());
        if (with_momentum) b.bufs.reserve(bucket.size());
      }
      if (fused) {
        const at::IntArrayRef strides = p.param.strides();
        b.params.push_back(flat.flat(p.param, strides, dtype, true));
        b.grads.push_back(flat.flat(p.grad, strides, dtype, false));
        if (with_momentum) b.bufs.push_back(flat.flat(buf, strides, dtype, true));
      } else {
        b.params.push_back(p.param);
        b.grads.push_back(p.grad.scalar_type() == dtype ? p.grad : p.grad.to(dtype));
        if (with_momentum) b.bufs.push_back(buf);
      }
    }
    for (int first = 0; first < 2; ++first) {
      run_fused(sgd, batches[1][first], group->lr, group->weight_decay);
      run_foreach(sgd, batches[0][first], group->lr, group->weight_decay);
    }
  }
  flat.commit();
}

kiln_status* sgd_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto sgd = std::make_unique<Sgd>();
    sgd->host = host;
    sgd->momentum = kiln_options_float(options, "momentum", 0.9);
    sgd->dampening = kiln_options_float(options, "dampening", 0.0);
    sgd->nesterov = kiln_options_bool(options, "nesterov", 0) != 0;
    kiln::optim::check_range("sgd", "momentum", sgd->momentum, 0.0, false, 1.0, true);
    kiln::optim::check_range("sgd", "dampening", sgd->dampening, 0.0, false, 1.0, false);
    if (sgd->nesterov && (sgd->momentum <= 0.0 || sgd->dampening != 0.0)) {
      kiln::optim::invalid("sgd", "nesterov requires momentum > 0 and dampening = 0 (momentum " +
                                      kiln::optim::number(sgd->momentum) + ", dampening " +
                                      kiln::optim::number(sgd->dampening) + ")");
    }
    *out = sgd.release();
  });
}

void sgd_destroy(void* instance) { delete static_cast<Sgd*>(instance); }

kiln_status* sgd_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Sgd& sgd = *static_cast<const Sgd*>(instance);
  return KILN_GUARD(sgd.host, { sgd_update(sgd, ctx, group); });
}

const kiln_optimizer_vtable kVtable = {sizeof(kiln_optimizer_vtable), sgd_create, sgd_destroy,
                                       sgd_step};

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "momentum", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.9", nullptr,
     "momentum factor, in [0, 1) (0: plain SGD, no state)"},
    {sizeof(kiln_option_spec), "dampening", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.0", nullptr,
     "dampening applied to the gradient added to the momentum buffer, in [0, 1]"},
    {sizeof(kiln_option_spec), "nesterov", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "false", nullptr,
     "Nesterov momentum (needs momentum > 0 and dampening = 0)"},
};

const kiln_capabilities kCaps = {sizeof(kiln_capabilities), kiln::optim::kOptimizerCaps, 0,
                                 nullptr};

const kiln_component_descriptor kSgd = {sizeof(kiln_component_descriptor),
                                        KILN_COMPONENT_OPTIMIZER,
                                        0,
                                        "sgd",
                                        {1, 1, 0},
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
                                            {1, 1, 0},
                                            1,
                                            kComponents,
                                            nullptr,
                                            nullptr,
                                            -1,
                                            0};

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
