// kiln_lookahead — "lookahead": Lookahead as pytorch_optimizer.Lookahead (4.1.0) computes it,
// around any optimizer ([optimizer.inner], a third party's included, through
// kiln_host_api.inner_step, ABI 1.14). The inner optimizer steps the fast weights every step;
// every k-th applied step they move to slow + α(fast - slow) and the slow weights take them.
// The slow weights are host state ("slow_params", from the weights of the first step), the
// inner optimizer's is the host's too: both are checkpointed. pullback_momentum is "none"
// (the reference's default); the others reach into the inner optimizer's state and are refused.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_lerp.h>

#include <memory>
#include <string>
#include <vector>

#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

using kiln::optim::Param;

struct Lookahead {
  const kiln_host_api* host;
  int64_t k;
  double alpha;
};

void lookahead_update(const Lookahead& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  kiln::optim::check_group("lookahead", group);
  const std::vector<Param> params = kiln::optim::read_group("lookahead", group);
  const kiln::optim::StateStore state(opt.host, ctx);
  // Slow weights start at the weights the first step sees.
  std::vector<at::Tensor> slow(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    bool created = false;
    slow[i] = state.get(params[i], "slow_params", KILN_STATE_ZEROS_LIKE_PARAM, &created);
    if (created) slow[i].copy_(params[i].param);
  }
  kiln::optim::check_host(opt.host, opt.host->inner_step(ctx, group));
  if (group->step % opt.k != 0) return;
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    std::vector<at::Tensor> ps, ss;
    for (size_t i : bucket) {
      ps.push_back(params[i].param);
      ss.push_back(slow[i]);
    }
    at::_foreach_lerp_(ps, ss, 1.0 - opt.alpha);
    at::_foreach_copy_(ss, ps);
  }
}

kiln_status* lookahead_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    if (!KILN_HAS_FIELD(host, kiln_host_api, inner_step)) {
      throw kiln::Error(KILN_ERR_UNSUPPORTED,
                        "lookahead: the host is older than Kiln ABI 1.14 (no inner optimizer)");
    }
    auto opt = std::make_unique<Lookahead>();
    opt->host = host;
    opt->k = kiln_options_int(options, "k", 5);
    opt->alpha = kiln_options_float(options, "alpha", 0.5);
    const std::string pullback = kiln_options_string(options, "pullback_momentum", "none");
    kiln::optim::check_range("lookahead", "k", static_cast<double>(opt->k), 1.0, false, HUGE_VAL,
                             false);
    kiln::optim::check_range("lookahead", "alpha", opt->alpha, 0.0, false, 1.0, false);
    if (pullback != "none") {
      kiln::optim::invalid("lookahead", "pullback_momentum = \"" + pullback +
                                            "\" is not supported (it changes the inner "
                                            "optimizer's state); use \"none\"");
    }
    *out = opt.release();
  });
}

void lookahead_destroy(void* instance) { delete static_cast<Lookahead*>(instance); }

kiln_status* lookahead_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Lookahead& opt = *static_cast<const Lookahead*>(instance);
  return KILN_GUARD(opt.host, { lookahead_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(lookahead_create, lookahead_destroy, lookahead_step);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_MIN_INIT("k", KILN_OPT_INT, 1.0, "5",
                         "inner steps between syncs of the slow weights, >= 1"),
    KILN_OPTION_RANGE_INIT("alpha", KILN_OPT_FLOAT, 0.0, 1.0, "0.5",
                           "step of the slow weights towards the fast ones, in [0, 1]"),
    KILN_OPTION_CHOICES_INIT("pullback_momentum", "none", "\"none\"",
                             "what a sync does to the inner optimizer's momentum: nothing"),
};

const kiln_capabilities kCaps =
    KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps | KILN_CAP_WRAPS_OPTIMIZER);

const kiln_component_descriptor kLookahead = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "lookahead", KILN_VERSION_INIT(1, 0, 0),
    "Lookahead as pytorch_optimizer.Lookahead over [optimizer.inner] (slow weights every k steps)",
    &kCaps, kOptions, &kVtable);

const kiln_component_descriptor* const kComponents[] = {&kLookahead};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-lookahead", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
