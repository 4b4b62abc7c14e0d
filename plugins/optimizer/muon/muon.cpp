// kiln_muon — the "muon" optimizer: Muon as torch.optim.Muon of torch 2.11 computes it
// (torch/optim/_muon.py, the single-tensor path, the only one torch has), over the whole group
// per call. Per step, for each 2-D parameter p (A x B) with gradient g:
//   buf = lerp(buf, g, 1 - momentum)                     (buf = momentum buf + (1 - momentum) g)
//   u   = nesterov ? lerp(g, buf, momentum) : buf
//   O   = NS(u): u in bfloat16, transposed when A > B, divided by max(||u||_F, eps), then
//         ns_steps times  G = X X^T;  H = b G + c G G;  X = a X + H X   (every matmul in
//         bfloat16, as torch runs it), transposed back
//   p   = p (1 - lr wd) - lr r O,   r = sqrt(max(1, A / B))       (adjust_lr_fn "original")
//                                   r = 0.2 sqrt(max(A, B))         ("match_rms_adamw")
// lr and wd are the group's; the momentum update is multi-tensor (_foreach), the Newton-Schulz
// iteration and the parameter update per parameter. Muon steps matrices only: a parameter of
// another rank is refused before anything changes (the host's [[optimizer.partition]] hands those
// to another optimizer).
//
// One deliberate difference: for bfloat16 parameters with nesterov = false, torch 2.11
// orthogonalises the momentum buffer itself (grad.bfloat16() is then no copy, and the division
// by the norm is in place), so its buffer is renormalised every step; here the buffer is kept.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/scalar_tensor.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

using kiln::optim::Param;

struct Muon {
  const kiln_host_api* host;
  double momentum;
  bool nesterov;
  double a, b, c;  // Newton-Schulz coefficients (torch's ns_coefficients)
  double eps;
  int64_t ns_steps;
  bool match_rms_adamw;  // adjust_lr_fn
};

// "[3, 4]" for messages.
std::string shape_text(const DLTensor& t) {
  std::string out = "[";
  for (int32_t d = 0; d < t.ndim; ++d) {
    out += (d ? ", " : "") + std::to_string(t.shape[d]);
  }
  return out + "]";
}

// Refuses the group, before anything changes, when a parameter is not a matrix.
void check_ranks(const kiln_param_group* group) {
  for (size_t i = 0; i < group->count; ++i) {
    const DLTensor& p = group->params[i];
    if (p.ndim == 2) continue;
    const std::string name = group->names != nullptr && group->names[i] != nullptr
                                 ? "'" + std::string(group->names[i]) + "'"
                                 : std::to_string(i);
    kiln::optim::invalid(
        "muon", "parameter " + name + " has shape " + shape_text(p) + " (" +
                    std::to_string(p.ndim) +
                    "-D), but Muon steps 2-D parameters only: hand the others to another "
                    "optimizer ([[optimizer.partition]] with min_rank = 2 and max_rank = 2 for "
                    "Muon, or max_rank = 1 for e.g. AdamW)");
  }
}

// torch.optim._muon._zeropower_via_newtonschulz, op for op (so that its bfloat16 roundings are
// the same): `update` A x B in any dtype, the result A x B in bfloat16.
at::Tensor newton_schulz(const Muon& opt, const at::Tensor& update) {
  // A copy in any case (a bfloat16 buffer must not be divided in place), row-major as torch's
  // update is, so that the matmuls see the operands' layout torch gives them.
  at::Tensor x = update.to(at::kBFloat16, /*non_blocking=*/false, /*copy=*/true).contiguous();
  const bool tall = update.size(0) > update.size(1);
  if (tall) x = x.t();
  // Tensor.norm() is linalg.vector_norm(x, 2) for a strided CPU or CUDA tensor.
  x.div_(at::clamp(at::linalg_vector_norm(x, 2), opt.eps, std::nullopt));
  for (int64_t k = 0; k < opt.ns_steps; ++k) {
    const at::Tensor gram = at::mm(x, x.t());
    const at::Tensor gram_update = at::addmm(gram, gram, gram, /*beta=*/opt.b, /*alpha=*/opt.c);
    x = at::addmm(x, gram_update, x, /*beta=*/opt.a);
  }
  return tall ? x.t() : x;
}

// A Python float as torch's Python API hands it to a tensor operand (param.mul_(0.998)): a 0-dim
// float64 "wrapped number", which half-precision kernels apply in float. C++'s Scalar overloads
// round it to the tensor's dtype first (0.998 becomes 0.99609375 in bfloat16).
at::Tensor python_float(double value) {
  at::Tensor t = at::scalar_tensor(value, at::kDouble);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// torch.optim._muon._adjust_lr.
double adjusted_lr(const Muon& opt, double lr, const at::Tensor& param) {
  const int64_t rows = param.size(0), cols = param.size(1);
  const double ratio =
      opt.match_rms_adamw
          ? 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)))
          : std::sqrt(std::max(1.0, static_cast<double>(rows) / static_cast<double>(cols)));
  return lr * ratio;
}

void muon_update(const Muon& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  kiln::optim::check_group("muon", group);
  check_ranks(group);
  const std::vector<Param> params = kiln::optim::read_group("muon", group);
  const kiln::optim::StateStore state(opt.host, ctx);
  // All state first, so that a host failure leaves every parameter untouched.
  std::vector<at::Tensor> bufs(params.size());
  for (size_t k = 0; k < params.size(); ++k) {
    bufs[k] = state.get(params[k], "momentum_buffer", KILN_STATE_ZEROS_LIKE_PARAM);
  }
  const double lr = group->lr;
  const double wd = group->weight_decay;
  for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
    std::vector<at::Tensor> ps, gs, bs;
    for (size_t k : bucket) {
      const Param& p = params[k];
      const at::ScalarType dtype = p.param.scalar_type();
      ps.push_back(p.param);
      gs.push_back(p.grad.scalar_type() == dtype ? p.grad : p.grad.to(dtype));
      bs.push_back(bufs[k]);
    }
    at::_foreach_lerp_(bs, gs, 1.0 - opt.momentum);
    const std::vector<at::Tensor> updates =
        opt.nesterov ? at::_foreach_lerp(gs, bs, opt.momentum) : bs;
    std::vector<at::Tensor> ortho;
    ortho.reserve(updates.size());
    for (const at::Tensor& u : updates) ortho.push_back(newton_schulz(opt, u));
    // Per parameter: the step size depends on the shape, and the bfloat16 update is added to
    // the parameter with its scale in the parameter's precision, as torch's add_(alpha=) does.
    // The decay's factor as torch's Python float (python_float). torch multiplies by 1 - lr wd
    // even when wd = 0, which is exact (x * 1 = x).
    // A parameter that is not row-major is updated in a row-major copy: half-precision kernels
    // round differently on the strided path than on the vectorised one torch's contiguous
    // parameters take.
    for (size_t j = 0; j < ps.size(); ++j) {
      at::Tensor p = ps[j];  // a handle: copy_ writes the shared storage
      at::Tensor work = p.is_contiguous() ? p : p.contiguous();
      if (wd != 0.0) work.mul_(python_float(1.0 - lr * wd));
      work.add_(ortho[j], -adjusted_lr(opt, lr, work));
      if (!work.is_same(p)) p.copy_(work);
    }
  }
}

kiln_status* muon_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    auto opt = std::make_unique<Muon>();
    opt->host = host;
    opt->momentum = kiln_options_float(options, "momentum", 0.95);
    opt->nesterov = kiln_options_bool(options, "nesterov", 1) != 0;
    opt->a = kiln_options_float(options, "ns_a", 3.4445);
    opt->b = kiln_options_float(options, "ns_b", -4.775);
    opt->c = kiln_options_float(options, "ns_c", 2.0315);
    opt->eps = kiln_options_float(options, "eps", 1e-7);
    opt->ns_steps = kiln_options_int(options, "ns_steps", 5);
    const std::string adjust = kiln_options_string(options, "adjust_lr_fn", "original");
    const double inf = HUGE_VAL;
    // torch accepts any momentum >= 0; 1 and above would never forget a gradient.
    kiln::optim::check_range("muon", "momentum", opt->momentum, 0.0, false, 1.0, true);
    kiln::optim::check_range("muon", "ns_a", opt->a, -inf, false, inf, false);
    kiln::optim::check_range("muon", "ns_b", opt->b, -inf, false, inf, false);
    kiln::optim::check_range("muon", "ns_c", opt->c, -inf, false, inf, false);
    // eps > 0: a zero update would otherwise divide 0 by 0.
    kiln::optim::check_range("muon", "eps", opt->eps, 0.0, true, inf, false);
    // torch refuses 100 and more ("for computational efficiency").
    kiln::optim::check_range("muon", "ns_steps", static_cast<double>(opt->ns_steps), 0.0, false,
                             99.0, false);
    if (adjust == "original") {
      opt->match_rms_adamw = false;
    } else if (adjust == "match_rms_adamw") {
      opt->match_rms_adamw = true;
    } else {
      kiln::optim::invalid(
          "muon",
          "adjust_lr_fn must be \"original\" or \"match_rms_adamw\", got \"" + adjust + "\"");
    }
    *out = opt.release();
  });
}

void muon_destroy(void* instance) { delete static_cast<Muon*>(instance); }

kiln_status* muon_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Muon& opt = *static_cast<const Muon*>(instance);
  return KILN_GUARD(opt.host, { muon_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(muon_create, muon_destroy, muon_step);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_SPEC_INIT("momentum", KILN_OPT_FLOAT, 1, 0.0, 1, 1.0, "0.95", NULL,
                          "momentum factor of the gradient buffer (momentum_buffer), in [0, 1)"),
    KILN_OPTION_INIT("nesterov", KILN_OPT_BOOL, "true",
                     "Nesterov momentum: orthogonalise lerp(grad, buffer, momentum)"),
    KILN_OPTION_INIT("ns_a", KILN_OPT_FLOAT, "3.4445",
                     "Newton-Schulz coefficient a of X <- a X + (b G + c G^2) X (torch's "
                     "ns_coefficients[0]), finite"),
    KILN_OPTION_INIT("ns_b", KILN_OPT_FLOAT, "-4.775",
                     "Newton-Schulz coefficient b (torch's ns_coefficients[1]), finite"),
    KILN_OPTION_INIT("ns_c", KILN_OPT_FLOAT, "2.0315",
                     "Newton-Schulz coefficient c (torch's ns_coefficients[2]), finite"),
    KILN_OPTION_MIN_INIT(
        "eps", KILN_OPT_FLOAT, 0.0, "1e-7",
        "lower bound of the norm the update is divided by before Newton-Schulz, > 0"),
    KILN_OPTION_RANGE_INIT("ns_steps", KILN_OPT_INT, 0.0, 99.0, "5",
                           "Newton-Schulz iterations per step, in [0, 99]"),
    KILN_OPTION_CHOICES_INIT("adjust_lr_fn", "original,match_rms_adamw", "\"original\"",
                             "lr scale by shape: original = sqrt(max(1, rows/cols)) (torch's "
                             "default, None), match_rms_adamw = 0.2 sqrt(max(rows, cols))"),
};

const kiln_capabilities kCaps = KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps);

const kiln_component_descriptor kMuon = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "muon", KILN_VERSION_INIT(1, 0, 0),
    "Muon as torch.optim.Muon (torch 2.11): momentum orthogonalised by a bfloat16 Newton-Schulz "
    "iteration, decoupled weight decay; 2-D parameters only",
    &kCaps, kOptions, &kVtable);

const kiln_component_descriptor* const kComponents[] = {&kMuon};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-muon", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
