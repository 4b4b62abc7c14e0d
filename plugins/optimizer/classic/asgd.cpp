// "asgd": torch.optim.ASGD (SGD with the step eta_t = lr / (1 + lambd lr t)^alpha and decay
// lambd, and the running average of the iterates ax, averaged from step t0 on; L2 weight decay
// added to the gradient), over the whole group per call with ATen's multi-tensor (_foreach) ops in
// cache-sized chunks (common/chunked.hpp). State as torch names it: "step", "eta" (started at the
// group's lr) and "mu" (the averaging weight, started at 1), each 0-dim float32 on the parameter's
// device as torch keeps them, and "ax".
//
// The arithmetic is that of torch's _single_tensor_asgd, not of _multi_tensor_asgd: the multi-
// tensor path computes p - eta (g + lambd p) where the single-tensor one computes
// p (1 - lambd eta) - eta g, and eta_t in float32 where the single-tensor one computes it in
// double, and over 100 steps that measured 2.8e-6 apart (torch 2.11, CPU); in the single-tensor
// order they agree exactly.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sub.h>

#include <algorithm>
#include <cmath>
#include <map>
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

struct Asgd {
  const kiln_host_api* host;
  double lambd;
  double alpha;
  double t0;
};

void asgd_update(const Asgd& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group("asgd", group);
  const kiln::optim::StateStore state(opt.host, ctx);
  const double lr = group->lr, wd = group->weight_decay;
  // All state first, so that a host failure leaves every parameter untouched.
  const size_t n = params.size();
  std::vector<at::Tensor> etas(n), mus(n), axs(n), steps(n);
  for (size_t k = 0; k < n; ++k) {
    const Param& p = params[k];
    steps[k] = state.get(p, "step", KILN_STATE_SCALAR_LIKE_PARAM);
    etas[k] = kiln::optim::scalar_state(state, p, "eta", lr);
    mus[k] = kiln::optim::scalar_state(state, p, "mu", 1.0);
    axs[k] = state.get(p, "ax", KILN_STATE_ZEROS_LIKE_PARAM);
  }
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    kiln::optim::BucketLists b = kiln::optim::bucket_lists(params, bucket);
    std::vector<at::Tensor> ps = b.params, gs = b.grads;
    const std::vector<at::Tensor> bucket_etas = pick(etas, bucket);
    const std::vector<at::Tensor> bucket_mus = pick(mus, bucket);
    const std::vector<at::Tensor> bucket_axs = pick(axs, bucket);
    const std::vector<at::Tensor> bucket_steps = pick(steps, bucket);
    at::_foreach_add_(bucket_steps, 1);

    // eta, mu and step of each parameter on the host (one copy for a device).
    std::vector<at::Tensor> scalars = bucket_etas;
    scalars.insert(scalars.end(), bucket_mus.begin(), bucket_mus.end());
    scalars.insert(scalars.end(), bucket_steps.begin(), bucket_steps.end());
    const std::vector<double> values = kiln::optim::host_values(scalars);
    const size_t m = ps.size();
    const std::vector<double> eta(values.begin(), values.begin() + m);
    const std::vector<double> mu(values.begin() + m, values.begin() + 2 * m);
    const std::vector<double> step(values.begin() + 2 * m, values.end());

    // p = p (1 - lambd eta) - eta g: the second term one call per distinct eta (all parameters
    // share one unless some joined the group late), as add_(g, alpha=-eta) rounds. Then
    // ax = p while mu is 1, else ax + (p - ax) mu. Element-wise, in cache-sized chunks.
    std::vector<double> decay;
    for (double e : eta) decay.push_back(1.0 - opt.lambd * e);
    std::vector<at::Tensor> ax = bucket_axs;
    kiln::optim::sweep_chunks({&ps, &gs, &ax}, [&](const std::vector<std::vector<at::Tensor>>& l,
                                                   const std::vector<size_t>& which) {
      const std::vector<at::Tensor>&cp = l[0], &cax = l[2];
      std::vector<at::Tensor> cg = l[1];
      if (wd != 0.0) cg = at::_foreach_add(cg, cp, wd);
      at::_foreach_mul_(cp, kiln::optim::chunk_scalars(decay, which));
      std::map<double, std::vector<size_t>> by_eta;
      for (size_t j = 0; j < which.size(); ++j) by_eta[eta[which[j]]].push_back(j);
      for (const auto& [e, idx] : by_eta) at::_foreach_add_(pick(cp, idx), pick(cg, idx), -e);
      std::vector<size_t> copied, averaged;
      std::vector<double> weights;
      for (size_t j = 0; j < which.size(); ++j) {
        if (mu[which[j]] != 1.0) {
          averaged.push_back(j);
          weights.push_back(mu[which[j]]);
        } else {
          copied.push_back(j);
        }
      }
      if (!copied.empty()) at::_foreach_copy_(pick(cax, copied), pick(cp, copied));
      if (!averaged.empty()) {
        std::vector<at::Tensor> diff = at::_foreach_sub(pick(cp, averaged), pick(cax, averaged));
        at::_foreach_mul_(diff, kiln::optim::scalar_list(weights));
        at::_foreach_add_(pick(cax, averaged), diff);
      }
    });

    // The next step's eta and mu, in double as torch's Python computes them.
    for (size_t i = 0; i < m; ++i) {
      at::Tensor eta_t = bucket_etas[i], mu_t = bucket_mus[i];  // handles: fill_ writes the state
      eta_t.fill_(lr / std::pow(1.0 + opt.lambd * lr * step[i], opt.alpha));
      mu_t.fill_(1.0 / std::max(1.0, step[i] - opt.t0));
    }
  }
}

kiln_status* asgd_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto opt = std::make_unique<Asgd>();
    opt->host = host;
    opt->lambd = kiln_options_float(options, "lambd", 1e-4);
    opt->alpha = kiln_options_float(options, "alpha", 0.75);
    opt->t0 = kiln_options_float(options, "t0", 1e6);
    const double inf = HUGE_VAL;
    kiln::optim::check_range("asgd", "lambd", opt->lambd, 0.0, false, inf, false);
    kiln::optim::check_range("asgd", "alpha", opt->alpha, 0.0, false, inf, false);
    kiln::optim::check_range("asgd", "t0", opt->t0, 0.0, false, inf, false);
    *out = opt.release();
  });
}

void asgd_destroy(void* instance) { delete static_cast<Asgd*>(instance); }

kiln_status* asgd_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Asgd& opt = *static_cast<const Asgd*>(instance);
  return KILN_GUARD(opt.host, { asgd_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(asgd_create, asgd_destroy, asgd_step);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_MIN_INIT("lambd", KILN_OPT_FLOAT, 0.0, "1e-4",
                         "decay term: the step scales the weights by 1 - lambd eta_t, >= 0"),
    KILN_OPTION_MIN_INIT("alpha", KILN_OPT_FLOAT, 0.0, "0.75",
                         "power of the step decay eta_t = lr / (1 + lambd lr t)^alpha, >= 0"),
    KILN_OPTION_MIN_INIT("t0", KILN_OPT_FLOAT, 0.0, "1e6",
                         "step from which ax averages the iterates (before it, ax follows them), "
                         ">= 0"),
};

const kiln_capabilities kCaps = KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps);

}  // namespace

const kiln_component_descriptor kAsgd = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "asgd", KILN_VERSION_INIT(1, 0, 0),
    "averaged SGD as torch.optim.ASGD (the average ax kept as state)", &kCaps, kOptions, &kVtable);

}  // namespace kiln::classic
