// kiln_sgd — the "sgd" optimizer: torch.optim.SGD's update (momentum, dampening, Nesterov,
// weight decay) over the whole group per call: ATen's fused SGD kernel for parameters whose
// momentum buffer shares their dense layout (CPU tensors below ATen's grain size on the calling
// thread alone: common/calling_thread.hpp), the multi-tensor (_foreach) ops for the rest (and
// for float16/bfloat16 on the CPU). Capturable (kiln/optimizer.h): the fused kernel takes the
// device lr and found_inf; the multi-tensor path selects its results on the device.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_sgd.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

using kiln::optim::Param;

// Tensors of one kernel call: same device and dtype, the same kernel and the same "first step"
// state. `grads` is refilled from each call's views; the rest holds while the host's
// reuse_token does.
struct Batch {
  std::vector<at::Tensor> params, grads, bufs;
  std::vector<at::Tensor> shapes;  // each parameter as the group gave it (params may be flat)
  std::vector<size_t> grad_of;     // the group position of each entry's gradient
  bool fused = false;
  bool first = false;
  bool calling_thread = false;  // fused, on the calling thread alone (steps_on_calling_thread)
};

// What one call built from the group, kept for the next call with the same reuse_token.
struct GroupPlan {
  uint64_t token = 0;  // 0: not reusable (built from fresh state or staged copies)
  std::vector<Batch> batches;
  kiln::optim::FlatViews flat;  // staged copies of this call's non-dense tensors
};

struct Sgd {
  const kiln_host_api* host;
  double momentum;
  double dampening;
  bool nesterov;
  std::vector<GroupPlan> plans;  // by group index
};

void run_fused(const Sgd& sgd, const Batch& b, double lr, double wd,
               const kiln::optim::DeviceScalars& device) {
  if (b.params.empty()) return;
  const kiln::optim::CallingThreadOnly small(b.calling_thread);
  // With momentum 0 the kernel takes no buffers at all.
  if (device.defined()) {
    at::_fused_sgd_(b.params, b.grads, b.bufs, wd, sgd.momentum, device.lr, sgd.dampening,
                    sgd.nesterov, /*maximize=*/false, /*is_first_step=*/b.first,
                    /*grad_scale=*/std::nullopt, device.found_inf);
  } else {
    at::_fused_sgd_(b.params, b.grads, b.bufs, wd, sgd.momentum, lr, sgd.dampening, sgd.nesterov,
                    /*maximize=*/false, /*is_first_step=*/b.first);
  }
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

// The same update out of place, for a capturable call: lr from the device, and buffers and
// parameters take the results only when found_inf is clear.
void run_foreach_gated(const Sgd& sgd, const Batch& b, double wd,
                       const kiln::optim::DeviceScalars& device) {
  if (b.params.empty()) return;
  std::vector<at::Tensor> d_p =
      wd != 0.0 ? at::_foreach_add(b.grads, b.params, wd) : at::_foreach_mul(b.grads, 1.0);
  std::vector<at::Tensor> update = d_p;
  if (sgd.momentum != 0.0) {
    std::vector<at::Tensor> bufs =
        b.first ? at::_foreach_mul(d_p, 1.0) : at::_foreach_mul(b.bufs, sgd.momentum);
    if (!b.first) at::_foreach_add_(bufs, d_p, 1.0 - sgd.dampening);
    update = sgd.nesterov ? at::_foreach_add(d_p, bufs, sgd.momentum) : bufs;
    kiln::optim::assign_unless_found_inf(b.bufs, bufs, device.found_inf);
  }
  std::vector<at::Tensor> params = at::_foreach_mul(update, device.lr);
  params = at::_foreach_sub(b.params, params);
  kiln::optim::assign_unless_found_inf(b.params, params, device.found_inf);
}

// The gradient of one batch entry as its kernel takes it: a flat view (or copy) in the
// parameter's layout for the fused kernel, the parameter's dtype for the multi-tensor ops.
at::Tensor grad_for(const Batch& b, size_t k, const at::Tensor& grad,
                    kiln::optim::FlatViews& flat) {
  const at::Tensor& param = b.shapes[k];
  const at::ScalarType dtype = param.scalar_type();
  if (b.fused) return flat.flat(grad, param.strides(), dtype, false);
  return grad.scalar_type() == dtype ? grad : grad.to(dtype);
}

// Sorts the group's parameters into batches, fetching their state.
void build_plan(const Sgd& sgd, kiln_call_context* ctx, const kiln_param_group* group,
                GroupPlan& plan) {
  // Nothing of an earlier plan survives a build that fails half way.
  plan.token = 0;
  plan.batches.clear();
  plan.flat = kiln::optim::FlatViews();
  const std::vector<Param> params = kiln::optim::read_group("sgd", group);
  const kiln::optim::StateStore state(sgd.host, ctx);
  kiln::optim::FlatViews& flat = plan.flat;
  const bool with_momentum = sgd.momentum != 0.0;
  // All state first, so that a host failure leaves every parameter untouched.
  std::vector<at::Tensor> bufs(params.size());
  std::vector<bool> created(params.size(), false);
  bool any_created = false;
  for (size_t k = 0; with_momentum && k < params.size(); ++k) {
    bool fresh = false;
    bufs[k] = state.get(params[k], "momentum_buffer", KILN_STATE_ZEROS_LIKE_PARAM, &fresh);
    created[k] = fresh;
    any_created = any_created || fresh;
  }
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    // [kernel: multi-tensor, fused with the team, fused on the calling thread][first step?]
    Batch batches[3][2];
    for (int f = 0; f < 3; ++f) {
      for (int first = 0; first < 2; ++first) {
        batches[f][first].fused = f >= 1;
        batches[f][first].calling_thread = f == 2;
        batches[f][first].first = first == 1;
      }
    }
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
      const int kernel = !fused ? 0 : kiln::optim::steps_on_calling_thread(p.param) ? 2 : 1;
      Batch& b = batches[kernel][created[k] ? 1 : 0];
      if (b.params.empty()) {
        // Room for the whole bucket at once: a step then grows no vector one by one.
        b.params.reserve(bucket.size());
        b.grads.reserve(bucket.size());
        if (with_momentum) b.bufs.reserve(bucket.size());
      }
      b.grad_of.push_back(p.index);
      b.shapes.push_back(p.param);
      if (fused) {
        const at::IntArrayRef strides = p.param.strides();
        b.params.push_back(flat.flat(p.param, strides, dtype, true));
        if (with_momentum) b.bufs.push_back(flat.flat(buf, strides, dtype, true));
      } else {
        b.params.push_back(p.param);
        if (with_momentum) b.bufs.push_back(buf);
      }
      b.grads.push_back(grad_for(b, b.params.size() - 1, p.grad, flat));
    }
    // Fused before multi-tensor, then the first-step batches, as the calls always ran.
    for (int first = 0; first < 2; ++first) {
      for (int f : {1, 2, 0}) {
        if (!batches[f][first].params.empty()) {
          plan.batches.push_back(std::move(batches[f][first]));
        }
      }
    }
  }
  // Fresh state starts differently next call; staged copies are this call's only.
  plan.token = any_created || flat.staged() ? 0 : kiln::optim::reuse_token(group);
}

// Refills each batch's gradients from this call's views (the parameters and buffers hold).
void refresh_grads(GroupPlan& plan, const kiln_param_group* group) {
  kiln::ViewCache& views = kiln::thread_view_cache();
  for (Batch& b : plan.batches) {
    for (size_t k = 0; k < b.params.size(); ++k) {
      const DLTensor& view = group->grads[b.grad_of[k]];
      // A step usually gets its gradients in the blocks of the step before: the tensor kept from
      // then, when it is that very view (not a copy), already is what grad_for would return.
      const at::Tensor& kept = b.grads[k];
      if (kept.defined() &&
          kept.const_data_ptr() == static_cast<const char*>(view.data) + view.byte_offset &&
          kiln::same_layout(kept, view)) {
        continue;
      }
      const at::Tensor grad = views.get(view);
      if (grad.sizes() != b.shapes[k].sizes() || grad.device() != b.shapes[k].device()) {
        kiln::optim::invalid("sgd", "gradient " + std::to_string(b.grad_of[k]) +
                                        " differs from its parameter in shape or device");
      }
      b.grads[k] = grad_for(b, k, grad, plan.flat);
    }
  }
}

void sgd_update(Sgd& sgd, kiln_call_context* ctx, const kiln_param_group* group) {
  if (sgd.plans.size() <= group->group_index) sgd.plans.resize(group->group_index + 1);
  GroupPlan& plan = sgd.plans[group->group_index];
  const uint64_t token = kiln::optim::reuse_token(group);
  if (token != 0 && plan.token == token) {
    kiln::optim::check_group("sgd", group);
    refresh_grads(plan, group);
  } else {
    build_plan(sgd, ctx, group, plan);
  }
  const kiln::optim::DeviceScalars device = kiln::optim::device_scalars("sgd", group);
  for (const Batch& b : plan.batches) {
    if (b.fused) {
      run_fused(sgd, b, group->lr, group->weight_decay, device);
    } else if (device.defined()) {
      run_foreach_gated(sgd, b, group->weight_decay, device);
    } else {
      run_foreach(sgd, b, group->lr, group->weight_decay);
    }
  }
  plan.flat.commit();
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
  Sgd& sgd = *static_cast<Sgd*>(instance);
  return KILN_GUARD(sgd.host, { sgd_update(sgd, ctx, group); });
}

const kiln_optimizer_vtable kVtable = KILN_OPTIMIZER_VTABLE_INIT(sgd_create, sgd_destroy, sgd_step);

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "momentum", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.9", nullptr,
     "momentum factor, in [0, 1) (0: plain SGD, no state)"},
    {sizeof(kiln_option_spec), "dampening", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.0", nullptr,
     "dampening applied to the gradient added to the momentum buffer, in [0, 1]"},
    {sizeof(kiln_option_spec), "nesterov", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "false", nullptr,
     "Nesterov momentum (needs momentum > 0 and dampening = 0)"},
};

const kiln_capabilities kCaps = {sizeof(kiln_capabilities),
                                 kiln::optim::kOptimizerCaps | KILN_CAP_CAPTURABLE, 0, nullptr};

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

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-sgd", KILN_VERSION_INIT(1, 1, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
