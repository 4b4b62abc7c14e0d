// kiln_soap — the "soap" optimizer: SOAP (Vyas et al., "SOAP: Improving and Stabilizing Shampoo
// using Adam") as pytorch_optimizer.SOAP of pytorch-optimizer 4.1.0 computes it
// (pytorch_optimizer/optimizer/soap.py), op for op, over the whole group per call. For each
// parameter p with gradient g, every dimension of size d <= max_precondition_dim keeps a d x d
// statistic GG_d and an eigenbasis Q_d (larger dimensions, and vectors without
// precondition_1d, keep none: the identity); project(x) is x with each dimension multiplied by
// Q_d^T (project back: by Q_d). At the group's step t (1-based, the host's count):
//   first use of p:  GG_d = lerp(0, g g^T over the other dims, 1 - shampoo_beta);
//                    Q_d = eigh(GG_d + 1e-30 I) eigenvectors, largest eigenvalue first
//   t = 1:           nothing else (no update, as the reference skips its first step)
//   t > 1, s = t-1:  m = lerp(m, g, 1 - beta1)                                (exp_avg)
//                    v = lerp(v, project(g)^2, 1 - beta2)                      (exp_avg_sq)
//                    u = project_back(project(m) / (sqrt(v) + eps))
//                    u = u / (sqrt(mean(u^2)) + eps)                (normalize_gradient)
//                    p = p - lr sqrt(1 - beta2^s) / (1 - beta1^s) u  (without correct_bias: lr)
//                    p = p (1 - lr wd)
//                    GG_d = lerp(GG_d, g g^T over the other dims, 1 - shampoo_beta)
//                    every precondition_frequency steps (s % f == 0): one power-iteration and QR
//                    step per basis, Q_d = qr(GG_d Q_d sorted by Q_d^T GG_d Q_d's diagonal, in
//                    float32), v's entries permuted with the same order
// lr and wd are the group's; the moments and the update are multi-tensor (_foreach), the
// projections and the eigenbases per parameter.
//
// STATE. exp_avg and exp_avg_sq are parameter-shaped host state. The reference's lists GG and Q
// are kept one host state tensor per basis (state_tensor_shaped, Kiln ABI 1.14), named by the
// list index as state["GG"][k] and state["Q"][k]: "GG.<k>" and "Q.<k>", d_k x d_k in the
// parameter's dtype, for each dimension k (of the merged shape under merge_dims) that has a
// basis; an identity keeps none, so a parameter whose every dimension is above
// max_precondition_dim keeps no GG or Q. "Q.<k>" holds Q_k TRANSPOSED (row-major Q_k^T, which is
// Q_k column-major, as LAPACK returns it and as the reference's matmuls see it).
//
// Refused (pytorch_optimizer 4.1.0 fails on them): merge_dims where every dimension of a
// parameter merges into one (merge_small_dims then gives [1]; any vector of 2 to
// max_precondition_dim elements). Not offered: maximize (no other Kiln optimizer has it).
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/argsort.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/linalg_eigh.h>
#include <ATen/ops/linalg_qr.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tensordot.h>

#include <cmath>
#include <exception>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

using kiln::optim::Param;

struct Soap {
  const kiln_host_api* host;
  double beta1;
  double beta2;
  double shampoo_beta;  // resolved: beta2 when the option is negative
  double eps;
  int64_t precondition_frequency;
  int64_t max_precondition_dim;
  bool merge_dims;
  bool channels_last;  // data_format
  bool precondition_1d;
  bool correct_bias;
  bool normalize_gradient;
};

std::string shape_text(at::IntArrayRef shape) {
  std::string out = "[";
  for (size_t d = 0; d < shape.size(); ++d) out += (d ? ", " : "") + std::to_string(shape[d]);
  return out + "]";
}

std::string param_name(const kiln_param_group* group, size_t i) {
  if (group->names != nullptr && group->names[i] != nullptr) {
    return "'" + std::string(group->names[i]) + "'";
  }
  return std::to_string(i);
}

// A Python float as torch's Python API hands it to a tensor operand (p.mul_(0.99)): a 0-dim
// float64 "wrapped number", which half-precision kernels apply in float. C++'s Scalar overloads
// (and _foreach_mul_/_foreach_add_ with a scalar) round it to the tensor's dtype first.
at::Tensor python_float(double value) {
  at::Tensor t = at::scalar_tensor(value, at::kDouble);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// x * s and x + s for every tensor of one dtype, as the reference's mul_(s) and add_(s) with a
// Python float: multi-tensor for float32 and float64, where the scalar overloads agree with it.
bool foreach_scalar_exact(const std::vector<at::Tensor>& ts) {
  if (ts.empty()) return true;
  const at::ScalarType t = ts[0].scalar_type();
  return t == at::kFloat || t == at::kDouble;
}
void mul_scalar_(const std::vector<at::Tensor>& ts, double s) {
  if (foreach_scalar_exact(ts)) {
    at::_foreach_mul_(ts, s);
    return;
  }
  const at::Tensor factor = python_float(s);
  for (at::Tensor t : ts) t.mul_(factor);  // handles: mul_ writes the shared storage
}
void add_scalar_(const std::vector<at::Tensor>& ts, double s) {
  if (foreach_scalar_exact(ts)) {
    at::_foreach_add_(ts, s);
    return;
  }
  const at::Tensor term = python_float(s);
  for (at::Tensor t : ts) t.add_(term);  // handles: add_ writes the shared storage
}

// pytorch_optimizer.optimizer.utils.shape.merge_small_dims, [1] for one merged dimension
// included.
std::vector<int64_t> merge_small_dims(at::IntArrayRef shape, int64_t max_dim) {
  std::vector<int64_t> merged;
  int64_t product = 1;
  for (int64_t d : shape) {
    product *= d;
    if (product > max_dim) {
      merged.push_back(product / d);
      product = d;
    }
  }
  merged.push_back(product);
  return merged.size() > 1 ? merged : std::vector<int64_t>{1};
}

// How one parameter is preconditioned.
struct Layout {
  std::vector<int64_t> shape;     // the parameter's
  bool merge = false;             // merge_dims
  bool permute = false;           // merge_dims of a 4-D parameter as channels_last
  std::vector<int64_t> permuted;  // shape after permute(0, 3, 1, 2) (else the shape)
  std::vector<int64_t> work;      // the shape the bases act on (merged, else the shape)
  std::vector<int64_t> dims;      // per basis: its size d, 0 for the identity

  // SOAP.merge_dims: the tensor the bases act on.
  at::Tensor to_work(at::Tensor t) const {
    if (!merge) return t;
    if (permute) t = t.permute({0, 3, 1, 2});
    return t.reshape(work);
  }
  at::Tensor from_work(const at::Tensor& t) const {
    if (!merge) return t;
    return permute ? t.reshape(permuted).permute({0, 2, 3, 1}) : t.reshape(shape);
  }
};

Layout layout_of(const Soap& opt, const at::Tensor& param, const kiln_param_group* group,
                 size_t index) {
  Layout l;
  l.shape = param.sizes().vec();
  l.merge = opt.merge_dims;
  l.permute = l.merge && opt.channels_last && param.dim() == 4;
  l.permuted =
      l.permute ? std::vector<int64_t>{l.shape[0], l.shape[3], l.shape[1], l.shape[2]} : l.shape;
  l.work = l.merge ? merge_small_dims(l.permuted, opt.max_precondition_dim) : l.shape;
  int64_t work_numel = 1;
  for (int64_t d : l.work) work_numel *= d;
  if (work_numel != param.numel()) {
    kiln::optim::invalid(
        "soap", "merge_dims merges every dimension of parameter " + param_name(group, index) +
                    " (shape " + shape_text(param.sizes()) +
                    ") into one, where pytorch_optimizer's SOAP asks for shape [1] and fails; "
                    "turn merge_dims off, lower max_precondition_dim below the parameter's "
                    "size, or hand such parameters to another optimizer "
                    "([[optimizer.partition]])");
  }
  const int64_t max_dim = opt.max_precondition_dim;
  if (param.dim() == 1) {
    const int64_t n = l.shape[0];
    l.dims = {opt.precondition_1d && n <= max_dim ? n : 0};
  } else {
    for (int64_t d : l.work) l.dims.push_back(d <= max_dim ? d : 0);
  }
  return l;
}

// One parameter's working set.
struct Item {
  Layout layout;
  at::Tensor grad;  // in the parameter's dtype, row-major (as the reference's gradients are)
  at::Tensor exp_avg, exp_avg_sq;
  // Per basis (undefined for the identity): GG_k, and Q_k as a column-major view of the host's
  // row-major Q_k^T. Written in place.
  std::vector<at::Tensor> gg, q;
  bool fresh = false;      // state created by this call (SOAP.init_group)
  bool has_bases = false;  // Q holds eigenbases (the reference's Q is not None)
};

// SOAP.project: `t` with every dimension multiplied by its basis (Q_d^T forward, Q_d back).
at::Tensor project(const Item& it, const at::Tensor& t, bool forward) {
  at::Tensor x = it.layout.to_work(t);
  for (const at::Tensor& q : it.q) {
    if (q.defined()) {
      x = at::tensordot(x, q, {0}, {forward ? 0 : 1});
    } else {
      std::vector<int64_t> order;
      for (int64_t d = 1; d < x.dim(); ++d) order.push_back(d);
      order.push_back(0);
      x = x.permute(order);
    }
  }
  return it.layout.from_work(x);
}

// SOAP.get_orthogonal_matrix: the eigenvectors of each GG_d, largest eigenvalue first (eigh in
// float64 for the dtypes it does not take).
void eigenbases(Item& it) {
  const std::vector<at::Tensor>& gg = it.gg;
  const std::vector<at::Tensor>& q = it.q;
  for (size_t d = 0; d < gg.size(); ++d) {
    if (!gg[d].defined()) continue;
    const at::Tensor& m = gg[d];
    const int64_t n = m.size(0);
    at::Tensor vectors;
    try {
      vectors = std::get<1>(at::linalg_eigh(m + at::eye(n, m.options()).mul(python_float(1e-30))));
    } catch (const std::exception&) {
      const at::Tensor m64 = m.to(at::kDouble);
      vectors =
          std::get<1>(at::linalg_eigh(m64 + at::eye(n, m64.options()).mul(python_float(1e-30))))
              .to(m.scalar_type());
    }
    at::Tensor target = q[d];  // a handle: copy_ writes the host's tensor
    target.copy_(at::flip(vectors, {1}));
  }
}

// SOAP.get_orthogonal_matrix_qr: one power-iteration step per basis, its columns sorted by the
// estimated eigenvalues (and exp_avg_sq's entries along that dimension with them), QR in
// float32.
void power_iteration(Item& it) {
  const std::vector<at::Tensor>& gg = it.gg;
  const std::vector<at::Tensor>& q = it.q;
  at::Tensor exp_avg_sq = it.layout.to_work(it.exp_avg_sq);
  std::vector<at::Tensor> updated(q.size());
  bool sorted = false;
  for (size_t d = 0; d < gg.size(); ++d) {
    if (!gg[d].defined()) continue;
    const at::Tensor product = at::mm(gg[d], q[d]);
    const at::Tensor estimated = (q[d] * product).sum(at::IntArrayRef{0});
    const at::Tensor order = at::argsort(estimated, /*dim=*/int64_t{-1}, /*descending=*/true);
    exp_avg_sq = exp_avg_sq.index_select(static_cast<int64_t>(d), order);
    sorted = true;
    const at::Tensor power = product.index_select(1, order);
    updated[d] = std::get<0>(at::linalg_qr(power.to(at::kFloat))).to(power.scalar_type());
  }
  if (sorted) it.exp_avg_sq.copy_(it.layout.from_work(exp_avg_sq));
  for (size_t d = 0; d < q.size(); ++d) {
    if (!updated[d].defined()) continue;
    at::Tensor target = q[d];  // a handle: copy_ writes the host's tensor
    target.copy_(updated[d]);
  }
}

// SOAP.update_pre_conditioner at the reference's `step` (its group count before this call's
// increment on first use, after it otherwise).
void update_preconditioner(const Soap& opt, Item& it, int64_t step) {
  const std::vector<at::Tensor>& gg = it.gg;
  const double weight = 1.0 - opt.shampoo_beta;
  const at::Tensor& g = it.grad;
  if (g.dim() == 1) {
    if (gg[0].defined()) {
      at::Tensor m = gg[0];  // a handle: lerp_ writes the host's tensor
      m.lerp_(at::mm(g.unsqueeze(1), g.unsqueeze(0)).to(m.scalar_type()), weight);
    }
  } else {
    const at::Tensor x = it.layout.to_work(g);
    for (int64_t d = 0; d < x.dim(); ++d) {
      if (!gg[d].defined()) continue;
      std::vector<int64_t> others;
      for (int64_t o = 0; o < x.dim(); ++o) {
        if (o != d) others.push_back(o);
      }
      at::Tensor m = gg[d];  // a handle: lerp_ writes the host's tensor
      m.lerp_(at::tensordot(x, x, others, others).to(m.scalar_type()), weight);
    }
  }
  if (!it.has_bases) {
    eigenbases(it);
    it.has_bases = true;
  }
  if (step > 0 && step % opt.precondition_frequency == 0) power_iteration(it);
}

// The host's d x d state tensor "<prefix>.<k>" of parameter `p`, in the parameter's dtype.
at::Tensor basis_state(const Soap& opt, kiln_call_context* ctx, const Param& p, const char* prefix,
                       size_t k, int64_t d) {
  const std::string name = std::string(prefix) + "." + std::to_string(k);
  const int64_t shape[2] = {d, d};
  DLTensor view{};
  kiln::optim::check_host(
      opt.host, opt.host->state_tensor_shaped(ctx, p.index, name.c_str(),
                                              kiln::dl_dtype_of(p.param.scalar_type()), 2, shape,
                                              &view, nullptr));
  at::Tensor t = kiln::thread_view_cache().get(view);
  if (t.sizes() != at::IntArrayRef(shape) || t.device() != p.param.device() ||
      t.scalar_type() != p.param.scalar_type()) {
    throw kiln::Error(KILN_ERR_INTERNAL, "host state tensor '" + name + "' of parameter " +
                                             std::to_string(p.index) + " has an unexpected layout");
  }
  return t;
}

void soap_update(const Soap& opt, kiln_call_context* ctx, const kiln_param_group* group) {
  const std::vector<Param> params = kiln::optim::read_group("soap", group);
  if (group->step < 1) {
    kiln::optim::invalid("soap", "step must be >= 1 (the 1-based count of optimizer steps), got " +
                                     std::to_string(group->step));
  }
  // Every refusal and all state first, so that a failure leaves every parameter untouched.
  std::vector<Item> items(params.size());
  for (size_t k = 0; k < params.size(); ++k) {
    items[k].layout = layout_of(opt, params[k].param, group, params[k].index);
  }
  const kiln::optim::StateStore state(opt.host, ctx);
  for (size_t k = 0; k < params.size(); ++k) {
    const Param& p = params[k];
    Item& it = items[k];
    it.exp_avg = state.get(p, "exp_avg", KILN_STATE_ZEROS_LIKE_PARAM, &it.fresh);
    it.has_bases = !it.fresh;
    it.exp_avg_sq = state.get(p, "exp_avg_sq", KILN_STATE_ZEROS_LIKE_PARAM);
    const std::vector<int64_t>& dims = it.layout.dims;
    it.gg.resize(dims.size());
    it.q.resize(dims.size());
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] == 0) continue;
      it.gg[d] = basis_state(opt, ctx, p, "GG", d, dims[d]);
      it.q[d] = basis_state(opt, ctx, p, "Q", d, dims[d]).t();  // kept transposed (STATE)
    }
    const at::ScalarType dtype = p.param.scalar_type();
    it.grad = (p.grad.scalar_type() == dtype ? p.grad : p.grad.to(dtype)).contiguous();
  }
  // SOAP.init_group: a parameter's first step only gathers statistics and finds its bases.
  const int64_t count = group->step;
  for (Item& it : items) {
    if (it.fresh) update_preconditioner(opt, it, count - 1);
  }
  if (count > 1) {
    const int64_t step = count - 1;
    const double lr = group->lr;
    double step_size = lr;
    if (opt.correct_bias) {
      const double bias_correction1 = 1.0 - std::pow(opt.beta1, static_cast<double>(step));
      const double bias_correction2_sq =
          std::sqrt(1.0 - std::pow(opt.beta2, static_cast<double>(step)));
      step_size *= bias_correction2_sq / bias_correction1;
    }
    for (const auto& bucket : kiln::optim::by_device_and_dtype(params)) {
      std::vector<at::Tensor> ps, gs, projected, exp_avgs, exp_avg_sqs;
      for (size_t k : bucket) {
        Item& it = items[k];
        ps.push_back(params[k].param);
        gs.push_back(it.grad);
        projected.push_back(project(it, it.grad, true));
        exp_avgs.push_back(it.exp_avg);
        exp_avg_sqs.push_back(it.exp_avg_sq);
      }
      at::_foreach_lerp_(exp_avgs, gs, 1.0 - opt.beta1);
      at::_foreach_lerp_(exp_avg_sqs, at::_foreach_mul(projected, projected), 1.0 - opt.beta2);
      std::vector<at::Tensor> denoms = at::_foreach_sqrt(exp_avg_sqs);
      add_scalar_(denoms, opt.eps);
      std::vector<at::Tensor> updates;
      for (size_t j = 0; j < bucket.size(); ++j) {
        const Item& it = items[bucket[j]];
        // Row-major, as the reference's exp_avg is, so that the matmuls see its layout.
        const at::Tensor m = project(it, it.exp_avg.contiguous(), true);
        at::Tensor u = project(it, m / denoms[j], false);
        if (opt.normalize_gradient) {
          u.div_(at::mean(u.square()).sqrt_().add_(python_float(opt.eps)));
        }
        updates.push_back(u);
      }
      // Parameters that are not row-major are updated in row-major copies: half-precision
      // kernels round differently on the strided path than on the vectorised one the
      // reference's contiguous parameters take.
      std::vector<at::Tensor> work;
      for (const at::Tensor& p : ps) work.push_back(p.is_contiguous() ? p : p.contiguous());
      at::_foreach_add_(work, updates, -step_size);
      if (group->weight_decay != 0.0) mul_scalar_(work, 1.0 - group->weight_decay * lr);
      for (size_t j = 0; j < ps.size(); ++j) {
        if (!work[j].is_same(ps[j])) ps[j].copy_(work[j]);
      }
    }
    for (Item& it : items) update_preconditioner(opt, it, step);
  }
}

kiln_status* soap_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    if (!KILN_HAS_FIELD(host, kiln_host_api, state_tensor_shaped) ||
        host->state_tensor_shaped == nullptr) {
      throw kiln::Error(KILN_ERR_UNSUPPORTED,
                        "soap: the host is older than Kiln ABI 1.14 (no shaped state for the "
                        "preconditioners GG and Q)");
    }
    auto opt = std::make_unique<Soap>();
    opt->host = host;
    opt->beta1 = kiln_options_float(options, "beta1", 0.95);
    opt->beta2 = kiln_options_float(options, "beta2", 0.95);
    const double shampoo_beta = kiln_options_float(options, "shampoo_beta", -1.0);
    opt->eps = kiln_options_float(options, "eps", 1e-8);
    opt->precondition_frequency = kiln_options_int(options, "precondition_frequency", 10);
    opt->max_precondition_dim = kiln_options_int(options, "max_precondition_dim", 10000);
    opt->merge_dims = kiln_options_bool(options, "merge_dims", 0) != 0;
    opt->precondition_1d = kiln_options_bool(options, "precondition_1d", 0) != 0;
    opt->correct_bias = kiln_options_bool(options, "correct_bias", 1) != 0;
    opt->normalize_gradient = kiln_options_bool(options, "normalize_gradient", 0) != 0;
    const std::string format = kiln_options_string(options, "data_format", "channels_first");
    const double inf = HUGE_VAL;
    kiln::optim::check_range("soap", "beta1", opt->beta1, 0.0, false, 1.0, true);
    kiln::optim::check_range("soap", "beta2", opt->beta2, 0.0, false, 1.0, true);
    if (!(shampoo_beta < 0.0 && std::isfinite(shampoo_beta))) {
      kiln::optim::check_range("soap", "shampoo_beta", shampoo_beta, 0.0, false, 1.0, true);
    }
    opt->shampoo_beta = shampoo_beta < 0.0 ? opt->beta2 : shampoo_beta;
    kiln::optim::check_range("soap", "eps", opt->eps, 0.0, false, inf, false);
    kiln::optim::check_range("soap", "precondition_frequency",
                             static_cast<double>(opt->precondition_frequency), 1.0, false, inf,
                             false);
    kiln::optim::check_range("soap", "max_precondition_dim",
                             static_cast<double>(opt->max_precondition_dim), 1.0, false, inf,
                             false);
    if (format == "channels_first") {
      opt->channels_last = false;
    } else if (format == "channels_last") {
      opt->channels_last = true;
    } else {
      kiln::optim::invalid(
          "soap",
          "data_format must be \"channels_first\" or \"channels_last\", got \"" + format + "\"");
    }
    *out = opt.release();
  });
}

void soap_destroy(void* instance) { delete static_cast<Soap*>(instance); }

kiln_status* soap_step(void* instance, kiln_call_context* ctx, const kiln_param_group* group) {
  const Soap& opt = *static_cast<const Soap*>(instance);
  return KILN_GUARD(opt.host, { soap_update(opt, ctx, group); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_INIT(soap_create, soap_destroy, soap_step);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_SPEC_INIT("beta1", KILN_OPT_FLOAT, 1, 0.0, 1, 1.0, "0.95", NULL,
                          "decay rate of the gradient average (exp_avg), in [0, 1)"),
    KILN_OPTION_SPEC_INIT("beta2", KILN_OPT_FLOAT, 1, 0.0, 1, 1.0, "0.95", NULL,
                          "decay rate of the projected squared-gradient average (exp_avg_sq), "
                          "in [0, 1)"),
    KILN_OPTION_SPEC_INIT("shampoo_beta", KILN_OPT_FLOAT, 1, -1.0, 1, 1.0, "-1.0", NULL,
                          "decay rate of the preconditioner statistics GG, in [0, 1); negative "
                          "(the default): beta2, as the reference's None"),
    KILN_OPTION_MIN_INIT("eps", KILN_OPT_FLOAT, 0.0, "1e-8",
                         "term added to the denominator for numerical stability, >= 0"),
    KILN_OPTION_MIN_INIT("precondition_frequency", KILN_OPT_INT, 1.0, "10",
                         "steps between the eigenbases' power-iteration (QR) updates, >= 1"),
    KILN_OPTION_MIN_INIT("max_precondition_dim", KILN_OPT_INT, 1.0, "10000",
                         "largest dimension given a basis; larger ones stay unrotated, >= 1"),
    KILN_OPTION_INIT("merge_dims", KILN_OPT_BOOL, "false",
                     "merge small adjacent dimensions (up to max_precondition_dim) before "
                     "preconditioning"),
    KILN_OPTION_INIT("precondition_1d", KILN_OPT_BOOL, "false",
                     "give vectors a basis too (a d x d matrix per vector of d elements)"),
    KILN_OPTION_INIT("correct_bias", KILN_OPT_BOOL, "true",
                     "scale the step by sqrt(1 - beta2^t) / (1 - beta1^t) (Adam's bias "
                     "correction)"),
    KILN_OPTION_INIT("normalize_gradient", KILN_OPT_BOOL, "false",
                     "divide each update by its root mean square (+ eps)"),
    KILN_OPTION_CHOICES_INIT("data_format", "channels_first,channels_last", "\"channels_first\"",
                             "with merge_dims: 4-D parameters are laid out NCHW "
                             "(channels_first) or NHWC (channels_last)"),
};

const kiln_capabilities kCaps = KILN_CAPABILITIES_INIT(kiln::optim::kOptimizerCaps);

const kiln_component_descriptor kSoap = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "soap", KILN_VERSION_INIT(1, 0, 0),
    "SOAP as pytorch_optimizer.SOAP (pytorch-optimizer 4.1.0): Adam in Shampoo's eigenbases, "
    "decoupled weight decay",
    &kCaps, kOptions, &kVtable);

const kiln_component_descriptor* const kComponents[] = {&kSoap};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-soap", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
