// "rprop": torch.optim.Rprop (resilient backpropagation: each coordinate moves by its own step
// size against the sign of its gradient; the step size grows by etaplus while the gradient keeps
// its sign and shrinks by etaminus when it flips, within [step_size_min, step_size_max]; lr is
// the initial step size), over the whole group per call in the order of torch's
// _multi_tensor_rprop (in cache-sized chunks: common/chunked.hpp). torch.optim.Rprop has no
// weight decay: a group with any is refused. State as torch names it: "step" (0-dim float32 on
// the parameter's device), "prev" (the last gradient, 0 where its sign flipped), "step_size"
// (started at the group's lr).
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sign.h>

#include <cmath>
#include <memory>
#include <vector>

#include "classic/components.hpp"
#include "common/chunked.hpp"
#include "common/multi_tensor.hpp"
#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace kiln::classic {
namespace {

using kiln::optim::Param;
using kiln::optim::pick;

struct Rprop {
  const kiln_host_api* host;
  double etaminus;
  double etaplus;
  double step_size_min;
  double step_size_max;
};

void rprop_update(const Rprop& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group("rprop", group);
  if (group->weight_decay != 0.0) {
    kiln::optim::invalid("rprop", "torch.optim.Rprop has no weight decay, got weight_decay " +
                                      kiln::optim::number(group->weight_decay) +
                                      " (set the group's weight decay to 0)");
  }
  const kiln::optim::StateStore state(opt.host, ctx);
  // All state first, so that a host failure leaves every parameter untouched.
  const size_t n = params.size();
  std::vector<at::Tensor> prevs(n), step_sizes(n), steps(n);
  for (size_t k = 0; k < n; ++k) {
    const Param& p = params[k];
    steps[k] = state.get(p, "step", KILN_STATE_SCALAR_LIKE_PARAM);
    prevs[k] = state.get(p, "prev", KILN_STATE_ZEROS_LIKE_PARAM);
    step_sizes[k] = kiln::optim::full_state(state, p, "step_size", group->lr);
  }
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    kiln::optim::BucketLists b = kiln::optim::bucket_lists(params, bucket);
    std::vector<at::Tensor> bucket_prevs = pick(prevs, bucket);
    std::vector<at::Tensor> bucket_step_sizes = pick(step_sizes, bucket);
    at::_foreach_add_(pick(steps, bucket), 1);
    kiln::optim::sweep_chunks(
        {&b.params, &b.grads, &bucket_prevs, &bucket_step_sizes},
        [&](const std::vector<std::vector<at::Tensor>>& l, const std::vector<size_t>&) {
          const std::vector<at::Tensor>&ps = l[0], &gs = l[1], &prev = l[2], &step_size = l[3];
          // Per coordinate: etaplus where g and prev agree in sign, etaminus where they differ,
          // 1 where either is 0.
          std::vector<at::Tensor> signs = at::_foreach_mul(gs, prev);
          at::_foreach_copy_(prev, gs);
          at::_foreach_sign_(signs);
          for (at::Tensor& sign : signs) {
            sign.masked_fill_(sign.gt(0), opt.etaplus);
            sign.masked_fill_(sign.lt(0), opt.etaminus);
            sign.masked_fill_(sign.eq(0), 1);
          }
          at::_foreach_mul_(step_size, signs);
          for (const at::Tensor& size : step_size) {
            at::Tensor s = size;  // a handle: clamp_ writes the state
            s.clamp_(opt.step_size_min, opt.step_size_max);
          }
          // Where the sign flipped the coordinate does not move, and its next step counts as
          // fresh.
          for (size_t i = 0; i < signs.size(); ++i) {
            at::Tensor pr = prev[i];
            pr.masked_fill_(signs[i].eq(opt.etaminus), 0);
          }
          const std::vector<at::Tensor> grad_signs = at::_foreach_sign(prev);
          at::_foreach_addcmul_(ps, grad_signs, step_size, -1);
        });
  }
}

kiln_status* rprop_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto opt = std::make_unique<Rprop>();
    opt->host = host;
    opt->etaminus = kiln_options_float(options, "etaminus", 0.5);
    opt->etaplus = kiln_options_float(options, "etaplus", 1.2);
    opt->step_size_min = kiln_options_float(options, "step_size_min", 1e-6);
    opt->step_size_max = kiln_options_float(options, "step_size_max", 50.0);
    const double inf = HUGE_VAL;
    kiln::optim::check_range("rprop", "etaminus", opt->etaminus, 0.0, true, 1.0, true);
    kiln::optim::check_range("rprop", "etaplus", opt->etaplus, 1.0, true, inf, false);
    kiln::optim::check_range("rprop", "step_size_min", opt->step_size_min, 0.0, false, inf, false);
    kiln::optim::check_range("rprop", "step_size_max", opt->step_size_max, opt->step_size_min,
                             false, inf, false);
    *out = opt.release();
  });
}

void rprop_destroy(void* instance) { delete static_cast<Rprop*>(instance); }

kiln_status* rprop_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Rprop& opt = *static_cast<const Rprop*>(instance);
  return KILN_GUARD(opt.host, { rprop_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(rprop_create, rprop_destroy, rprop_step);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_RANGE_INIT("etaminus", KILN_OPT_FLOAT, 0.0, 1.0, "0.5",
                           "step-size factor where the gradient's sign flips (torch's etas[0]), in "
                           "(0, 1)"),
    KILN_OPTION_MIN_INIT("etaplus", KILN_OPT_FLOAT, 1.0, "1.2",
                         "step-size factor where the gradient keeps its sign (torch's etas[1]), "
                         "> 1"),
    KILN_OPTION_MIN_INIT("step_size_min", KILN_OPT_FLOAT, 0.0, "1e-6",
                         "smallest step size (torch's step_sizes[0]), >= 0"),
    KILN_OPTION_MIN_INIT("step_size_max", KILN_OPT_FLOAT, 0.0, "50.0",
                         "largest step size (torch's step_sizes[1]), >= step_size_min"),
};

const kiln_capabilities kCaps = KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps);

}  // namespace

const kiln_component_descriptor kRprop = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "rprop", KILN_VERSION_INIT(1, 0, 0),
    "Rprop as torch.optim.Rprop (lr: the initial step size; no weight decay)", &kCaps, kOptions,
    &kVtable);

}  // namespace kiln::classic
