// kiln_lbfgs — "lbfgs": L-BFGS as torch.optim.LBFGS (torch 2.11) computes it, with or without
// its strong-Wolfe line search. One call per step over every group (step_all, ABI 1.14): torch's
// closure is kiln_host_api.reevaluate (the same micro-batches again at the weights written here,
// the gradients all-reduced and unscaled in the same memory as `grads`); the first closure value
// of torch's step is the host's own pass (args->loss, the gradients already in `grads`).
//
// ONE PARAMETER GROUP. torch's LBFGS takes one group; here every parameter of every group of
// the call is one flat vector, in group order and each parameter's elements in row-major order
// (torch's view(-1)). Groups must share one lr (the group's lr, schedule included) and have no
// weight decay (torch's LBFGS has none); every parameter one device and one dtype, float32 or
// float64. The flat vectors (gradient, direction, history rows) exist only inside a step. The
// order matters beyond the layout: dot products sum in it, and L-BFGS amplifies their rounding.
// One group in the model's order (e.g. [optimizer.custom_keys] '.' = {}) is torch's
// model.parameters() and runs bit for bit as torch; Kiln's default groups put the biases after
// every weight, which torch.optim.LBFGS would step with the same order of parameters.
//
// STATE (all host state, so a checkpoint holds it and a resumed run continues bit for bit):
//  - per parameter, its slice of torch's flat vectors, shaped [numel] in the parameter's dtype:
//    "d" (the last direction) and "prev_flat_grad";
//  - per parameter, the history as ring buffers shaped [history_size, numel]: "old_dirs" (y)
//    and "old_stps" (s); row (history_start + i) % history_size is torch's old_dirs[i];
//  - on the first parameter (the first of the flat vector): "ro" shaped [history_size] in the
//    same dtype, ro[(history_start + i) % history_size] is torch's ro[i]; and torch's scalars as
//    KILN_STATE_SCALAR_F64: "n_iter", "func_evals", "t", "H_diag", "prev_loss", and the ring's
//    "history_start" and "history_count" (torch's len(old_dirs)). t and H_diag are 0-dim
//    tensors or Python numbers in torch; both enter the next step only through d.mul(t) and
//    torch.mul(q, H_diag), where ATen rounds them to the vectors' dtype, so their value is all
//    that matters.
// Nothing is written to the state before the step ends: a re-evaluation whose gradients are not
// finite puts the weights back as they were when the step began and leaves the state as it was.
//
// NUMBERS. torch mixes Python floats (the losses, lr, the constants) with 0-dim tensors of the
// vectors' dtype (dot products, gtd, t after an interpolation) in its scalar code; `Num` below
// computes each operation as Python and ATen do (a Python float meeting a tensor is converted to
// the tensor's dtype first, comparisons included; `float / tensor` is reciprocal() * float), so
// the line search takes torch's branches. Reductions (dot, sum, max) run in ATen on flat vectors
// laid out as torch's.
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/optim_common.hpp"
#include "kiln/sdk.hpp"
#include "kiln/torch.hpp"

namespace {

using kiln::optim::Param;

constexpr const char* kName = "lbfgs";

struct Lbfgs {
  const kiln_host_api* host;
  int64_t max_iter;
  int64_t max_eval;  // resolved: max_iter * 5 / 4 when the option is 0 (torch's None)
  double tolerance_grad;
  double tolerance_change;
  int64_t history_size;
  bool strong_wolfe;
};

// ---- torch's scalar arithmetic
// -------------------------------------------------------------------

// A number of torch's LBFGS code: a Python float (double arithmetic), or a 0-dim tensor of the
// flat vectors' dtype, held exactly as a double. A tensor operation rounds its result to the
// dtype; computing a float32 +, -, *, / or sqrt in double and rounding once gives the float32
// result (53 >= 2 * 24 + 2 bits), so doubles carry both.
struct Num {
  enum Kind { kPython = 0, kFloat32 = 1, kFloat64 = 2 };
  double v = 0.0;
  int kind = kPython;
  Num() = default;
  Num(double value) : v(value) {}  // NOLINT(google-explicit-constructor): a Python literal
  static double round_to(double x, int kind) {
    return kind == kFloat32 ? static_cast<double>(static_cast<float>(x)) : x;
  }
  static Num tensor(double value, int kind) {
    Num n;
    n.kind = kind;
    n.v = round_to(value, kind);
    return n;
  }
};

// The kind of an operation's result: a tensor's when either operand is one.
int kind_of(const Num& a, const Num& b) { return a.kind != Num::kPython ? a.kind : b.kind; }

template <typename Op>
Num binary(const Num& a, const Num& b, Op op) {
  const int k = kind_of(a, b);
  if (k == Num::kPython) return op(a.v, b.v);
  return Num::tensor(op(Num::round_to(a.v, k), Num::round_to(b.v, k)), k);
}

Num operator+(const Num& a, const Num& b) {
  return binary(a, b, [](double x, double y) { return x + y; });
}
Num operator-(const Num& a, const Num& b) {
  return binary(a, b, [](double x, double y) { return x - y; });
}
Num operator*(const Num& a, const Num& b) {
  return binary(a, b, [](double x, double y) { return x * y; });
}
Num operator/(const Num& a, const Num& b) {
  if (a.kind == Num::kPython && b.kind != Num::kPython) {
    // Tensor.__rtruediv__: self.reciprocal() * other.
    return Num::tensor(Num::round_to(1.0 / b.v, b.kind) * Num::round_to(a.v, b.kind), b.kind);
  }
  return binary(a, b, [](double x, double y) { return x / y; });
}
Num operator-(Num a) {
  a.v = -a.v;
  return a;
}
Num abs(Num a) {
  a.v = std::fabs(a.v);
  return a;
}
Num sqrt(const Num& a) {
  return a.kind == Num::kPython ? Num(std::sqrt(a.v)) : Num::tensor(std::sqrt(a.v), a.kind);
}
// Comparisons in the tensor's dtype when either side is one.
template <typename Op>
bool compare(const Num& a, const Num& b, Op op) {
  const int k = kind_of(a, b);
  return op(Num::round_to(a.v, k), Num::round_to(b.v, k));
}
bool operator<(const Num& a, const Num& b) {
  return compare(a, b, [](double x, double y) { return x < y; });
}
bool operator<=(const Num& a, const Num& b) {
  return compare(a, b, [](double x, double y) { return x <= y; });
}
bool operator>(const Num& a, const Num& b) {
  return compare(a, b, [](double x, double y) { return x > y; });
}
bool operator>=(const Num& a, const Num& b) {
  return compare(a, b, [](double x, double y) { return x >= y; });
}
// Python's max(a, b) and min(a, b): the first unless the second compares greater (smaller).
Num py_max(const Num& a, const Num& b) { return b > a ? b : a; }
Num py_min(const Num& a, const Num& b) { return b < a ? b : a; }

// torch.optim.lbfgs._cubic_interpolate; `bounds` null: the interval of x1 and x2.
Num cubic_interpolate(const Num& x1, double f1, const Num& g1, const Num& x2, double f2,
                      const Num& g2, const Num* bounds = nullptr) {
  Num xmin_bound, xmax_bound;
  if (bounds != nullptr) {
    xmin_bound = bounds[0];
    xmax_bound = bounds[1];
  } else if (x1 <= x2) {
    xmin_bound = x1;
    xmax_bound = x2;
  } else {
    xmin_bound = x2;
    xmax_bound = x1;
  }
  const Num d1 = g1 + g2 - Num(3) * (Num(f1) - Num(f2)) / (x1 - x2);
  const Num d2_square = d1 * d1 - g1 * g2;  // d1**2: ATen squares by one multiplication
  if (d2_square >= Num(0)) {
    const Num d2 = sqrt(d2_square);
    const Num min_pos = x1 <= x2 ? x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + Num(2) * d2))
                                 : x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + Num(2) * d2));
    return py_min(py_max(min_pos, xmin_bound), xmax_bound);
  }
  return (xmin_bound + xmax_bound) / Num(2.0);
}

// ---- the flat vector over the groups
// -------------------------------------------------------------

// A re-evaluation found gradients that are not finite: the step is abandoned.
struct NotFinite {};

// One parameter of the flat vector with its state.
struct Slot {
  kiln_call_context* ctx;
  Param p;
  int64_t offset;
  int64_t numel;
  at::Tensor d, prev_flat_grad;   // [numel]
  at::Tensor old_dirs, old_stps;  // [history_size, numel]
};

at::Tensor shaped_state(const Lbfgs& opt, kiln_call_context* ctx, const Param& p, const char* name,
                        const std::vector<int64_t>& shape) {
  DLTensor view{};
  kiln::optim::check_host(opt.host,
                          opt.host->state_tensor_shaped(
                              ctx, p.index, name, kiln::dl_dtype_of(p.param.scalar_type()),
                              static_cast<int32_t>(shape.size()), shape.data(), &view, nullptr));
  at::Tensor t = kiln::thread_view_cache().get(view);
  if (t.sizes() != at::IntArrayRef(shape) || t.device() != p.param.device() ||
      t.scalar_type() != p.param.scalar_type() || !t.is_contiguous()) {
    throw kiln::Error(KILN_ERR_INTERNAL, std::string("host state tensor '") + name +
                                             "' of parameter " + std::to_string(p.index) +
                                             " has an unexpected layout");
  }
  return t;
}

// torch's history (old_dirs, old_stps, ro) during a step: the ring's rows that are still in it,
// then the entries added in this step (written to the ring by commit()).
class History {
 public:
  History(std::vector<Slot>& slots, int64_t size, int64_t start, int64_t count,
          std::vector<double> ro_ring)
      : slots_(slots), size_(size), start_(start), stored_(count), ro_ring_(std::move(ro_ring)) {
    for (int64_t i = 0; i < count; ++i) ro_.push_back(ro_ring_[(start + i) % size]);
  }

  int64_t length() const { return stored_ - dropped_ + static_cast<int64_t>(new_dirs_.size()); }
  double ro(int64_t i) const { return ro_[i]; }
  at::Tensor dir(int64_t i) const { return entry(i, true); }
  at::Tensor stp(int64_t i) const { return entry(i, false); }

  void clear() {
    dropped_ = stored_;
    new_dirs_.clear();
    new_stps_.clear();
    ro_.clear();
  }
  // old_dirs.pop(0) etc.
  void pop_front() {
    if (dropped_ < stored_) {
      ++dropped_;
    } else {
      new_dirs_.erase(new_dirs_.begin());
      new_stps_.erase(new_stps_.begin());
    }
    ro_.erase(ro_.begin());
  }
  void push_back(at::Tensor y, at::Tensor s, double ro) {
    new_dirs_.push_back(std::move(y));
    new_stps_.push_back(std::move(s));
    ro_.push_back(ro);
  }

  // The ring as it is now: rows, ro, and the new start and count.
  void commit(const at::Tensor& ro_state, int64_t* start, int64_t* count) {
    const int64_t new_start = (start_ + dropped_) % size_;
    const int64_t kept = stored_ - dropped_;
    for (size_t j = 0; j < new_dirs_.size(); ++j) {
      const int64_t row = (new_start + kept + static_cast<int64_t>(j)) % size_;
      for (Slot& s : slots_) {
        s.old_dirs.select(0, row).copy_(new_dirs_[j].narrow(0, s.offset, s.numel));
        s.old_stps.select(0, row).copy_(new_stps_[j].narrow(0, s.offset, s.numel));
      }
    }
    for (int64_t i = 0; i < length(); ++i) ro_ring_[(new_start + i) % size_] = ro_[i];
    at::Tensor ro_host = at::empty({size_}, at::TensorOptions().dtype(at::kDouble));
    std::memcpy(ro_host.data_ptr<double>(), ro_ring_.data(), sizeof(double) * ro_ring_.size());
    ro_state.copy_(ro_host);
    *start = new_start;
    *count = length();
  }

 private:
  at::Tensor entry(int64_t i, bool dirs) const {
    const int64_t kept = stored_ - dropped_;
    if (i >= kept) return (dirs ? new_dirs_ : new_stps_)[i - kept];
    // One row of the ring, flat: a new contiguous tensor as torch's history entries are.
    const int64_t row = (start_ + dropped_ + i) % size_;
    std::vector<at::Tensor> parts;
    parts.reserve(slots_.size());
    for (const Slot& s : slots_) parts.push_back((dirs ? s.old_dirs : s.old_stps).select(0, row));
    return at::cat(parts);
  }

  std::vector<Slot>& slots_;
  int64_t size_, start_, stored_;
  int64_t dropped_ = 0;  // rows of the ring popped in this step
  std::vector<at::Tensor> new_dirs_, new_stps_;
  std::vector<double> ro_;       // torch's ro, in order
  std::vector<double> ro_ring_;  // the "ro" state, by ring row
};

class Step {
 public:
  Step(const Lbfgs& opt, const kiln_optimizer_step_args* args) : opt_(opt), args_(args) {}

  void run() {
    read_groups();
    if (slots_.empty()) return;
    read_state();
    saved_ = clone_params();
    try {
      optimize();
    } catch (const NotFinite&) {
      set_params(saved_);
      return;
    } catch (...) {
      set_params(saved_);  // a failing host service: the weights as they were, the error passed on
      throw;
    }
    commit();
  }

 private:
  // ---- reading the call
  // "2 (head.weight, ...)": a group by its index in the plan and its first parameter.
  static std::string describe(const kiln_param_group& group) {
    std::string out = std::to_string(group.group_index);
    if (group.count > 0 && group.names != nullptr && group.names[0] != nullptr) {
      out += std::string(" (") + group.names[0] + (group.count > 1 ? ", ...)" : ")");
    }
    return out;
  }

  void read_groups() {
    if (args_ == nullptr || args_->struct_size < KILN_SIZE_UP_TO(kiln_optimizer_step_args, loss) ||
        (args_->group_count > 0 &&
         (args_->groups == nullptr || args_->group_contexts == nullptr))) {
      kiln::optim::invalid(kName, "step_all called without groups");
    }
    int64_t offset = 0;
    for (size_t g = 0; g < args_->group_count; ++g) {
      const kiln_param_group& group = args_->groups[g];
      std::vector<Param> params = kiln::optim::read_group(kName, &group);
      if (group.weight_decay != 0.0) {
        kiln::optim::invalid(kName, "torch.optim.LBFGS has no weight decay, but parameter group " +
                                        describe(group) + " has weight_decay " +
                                        kiln::optim::number(group.weight_decay) + " (set it to 0)");
      }
      if (g > 0 && group.lr != args_->groups[0].lr) {
        kiln::optim::invalid(kName,
                             "torch.optim.LBFGS takes one parameter group, but parameter groups " +
                                 describe(args_->groups[0]) + " and " + describe(group) +
                                 " have different learning rates (" +
                                 kiln::optim::number(args_->groups[0].lr) + " and " +
                                 kiln::optim::number(group.lr) + "): give every group the same lr");
      }
      for (Param& p : params) {
        if (!slots_.empty() && (p.param.device() != slots_.front().p.param.device() ||
                                p.param.scalar_type() != slots_.front().p.param.scalar_type())) {
          throw kiln::Error(KILN_ERR_UNSUPPORTED,
                            "lbfgs: every parameter must have one device and dtype (torch's "
                            "LBFGS steps one flat vector); " +
                                std::string(group.names != nullptr ? group.names[p.index] : "?") +
                                " differs from the first");
        }
        const int64_t n = p.param.numel();
        slots_.push_back({args_->group_contexts[g], std::move(p), offset, n, {}, {}, {}, {}});
        offset += n;
      }
    }
    if (slots_.empty()) return;
    lr_ = args_->groups[0].lr;
    const at::ScalarType dtype = slots_.front().p.param.scalar_type();
    if (dtype == at::kFloat) {
      kind_ = Num::kFloat32;
    } else if (dtype == at::kDouble) {
      kind_ = Num::kFloat64;
    } else {
      throw kiln::Error(KILN_ERR_UNSUPPORTED, "lbfgs: parameters must be float32 or float64, not " +
                                                  std::string(c10::toString(dtype)));
    }
  }

  // ---- host state
  at::Tensor scalar(const char* name) const {
    const Slot& first = slots_.front();
    return kiln::optim::StateStore(opt_.host, first.ctx).get(first.p, name, KILN_STATE_SCALAR_F64);
  }

  void read_state() {
    const int64_t h = opt_.history_size;
    for (Slot& s : slots_) {
      s.d = shaped_state(opt_, s.ctx, s.p, "d", {s.numel});
      s.prev_flat_grad = shaped_state(opt_, s.ctx, s.p, "prev_flat_grad", {s.numel});
      s.old_dirs = shaped_state(opt_, s.ctx, s.p, "old_dirs", {h, s.numel});
      s.old_stps = shaped_state(opt_, s.ctx, s.p, "old_stps", {h, s.numel});
    }
    ro_state_ = shaped_state(opt_, slots_.front().ctx, slots_.front().p, "ro", {h});
    for (const char* name :
         {"n_iter", "func_evals", "t", "H_diag", "prev_loss", "history_start", "history_count"}) {
      scalars_.push_back(scalar(name));
    }
    state_n_iter_ = static_cast<int64_t>(value(0));
    func_evals_ = static_cast<int64_t>(value(1));
    t_ = Num(value(2));
    h_diag_ = Num(value(3));
    prev_loss_ = value(4);
    const int64_t start = static_cast<int64_t>(value(5));
    const int64_t count = static_cast<int64_t>(value(6));
    if (start < 0 || start >= h || count < 0 || count > h) {
      throw kiln::Error(KILN_ERR_INTERNAL, "lbfgs: the history's state is out of range");
    }
    const at::Tensor ro = ro_state_.to(at::kCPU, at::kDouble).contiguous();
    std::vector<double> ro_ring(ro.data_ptr<double>(), ro.data_ptr<double>() + h);
    history_ = std::make_unique<History>(slots_, h, start, count, std::move(ro_ring));
    if (state_n_iter_ > 0) {
      d_ = flat([](const Slot& s) { return s.d; });
      prev_flat_grad_ = flat([](const Slot& s) { return s.prev_flat_grad; });
    }
  }

  double value(size_t i) const { return scalars_[i].data_ptr<double>()[0]; }
  void set_value(size_t i, double v) { scalars_[i].data_ptr<double>()[0] = v; }

  void commit() {
    set_value(0, static_cast<double>(state_n_iter_));
    set_value(1, static_cast<double>(func_evals_));
    if (!iterated_) return;  // torch returned before its loop: only func_evals moved
    set_value(2, t_.v);
    set_value(3, h_diag_.v);
    set_value(4, prev_loss_);
    for (Slot& s : slots_) {
      s.d.copy_(d_.narrow(0, s.offset, s.numel));
      s.prev_flat_grad.copy_(prev_flat_grad_.narrow(0, s.offset, s.numel));
    }
    int64_t start = 0, count = 0;
    history_->commit(ro_state_, &start, &count);
    set_value(5, static_cast<double>(start));
    set_value(6, static_cast<double>(count));
  }

  // ---- torch's helpers
  template <typename Part>
  at::Tensor flat(Part part) const {
    std::vector<at::Tensor> parts;
    parts.reserve(slots_.size());
    for (const Slot& s : slots_) parts.push_back(part(s).reshape({-1}));
    return at::cat(parts);
  }
  // _gather_flat_grad
  at::Tensor gather_flat_grad() const {
    return flat([](const Slot& s) { return s.p.grad; });
  }
  // _add_grad(step_size, update): alpha is rounded to the dtype by the kernel, as in torch.
  void add_grad(const Num& step_size, const at::Tensor& update) {
    for (Slot& s : slots_) {
      s.p.param.add_(update.narrow(0, s.offset, s.numel).view(s.p.param.sizes()), step_size.v);
    }
  }
  std::vector<at::Tensor> clone_params() const {
    std::vector<at::Tensor> out;
    for (const Slot& s : slots_) out.push_back(s.p.param.clone(at::MemoryFormat::Contiguous));
    return out;
  }
  void set_params(const std::vector<at::Tensor>& x) {
    for (size_t i = 0; i < slots_.size(); ++i) slots_[i].p.param.copy_(x[i]);
  }
  Num num(const at::Tensor& zero_dim) const { return Num::tensor(zero_dim.item<double>(), kind_); }
  Num dot(const at::Tensor& a, const at::Tensor& b) const { return num(a.dot(b)); }
  Num abs_max(const at::Tensor& a) const { return num(a.abs().max()); }
  // The closure: the loss at the weights as they are now; the gradients are then in `grads`.
  double closure() {
    kiln_reevaluation r{};
    r.struct_size = sizeof(r);
    kiln::optim::check_host(opt_.host, opt_.host->reevaluate(args_->ctx, &r));
    if (r.finite == 0) throw NotFinite{};
    return r.loss;
  }
  // _directional_evaluate
  std::pair<double, at::Tensor> directional_evaluate(const std::vector<at::Tensor>& x, const Num& t,
                                                     const at::Tensor& d) {
    add_grad(t, d);
    const double loss = closure();
    at::Tensor flat_grad = gather_flat_grad();
    set_params(x);
    return {loss, std::move(flat_grad)};
  }

  // ---- torch.optim.lbfgs._strong_wolfe
  struct LineSearch {
    double f_new;
    at::Tensor g_new;
    Num t;
    int64_t ls_func_evals;
  };

  LineSearch strong_wolfe(const std::vector<at::Tensor>& x, Num t, const at::Tensor& d, double f,
                          const at::Tensor& g_in, const Num& gtd, int64_t max_ls) {
    const double c1 = 1e-4, c2 = 0.9;
    const double tolerance_change = 1e-9;  // _strong_wolfe's default: torch does not pass its own
    const Num d_norm = abs_max(d);
    const at::Tensor g = g_in.clone(at::MemoryFormat::Contiguous);
    auto [f_new, g_new] = directional_evaluate(x, t, d);
    int64_t ls_func_evals = 1;
    Num gtd_new = dot(g_new, d);

    Num t_prev = 0;
    double f_prev = f;
    at::Tensor g_prev = g;
    Num gtd_prev = gtd;
    bool done = false;
    int64_t ls_iter = 0;
    std::vector<Num> bracket, bracket_gtd;
    std::vector<double> bracket_f;
    std::vector<at::Tensor> bracket_g;
    while (ls_iter < max_ls) {
      if (Num(f_new) > (Num(f) + Num(c1) * t * gtd) || (ls_iter > 1 && f_new >= f_prev)) {
        bracket = {t_prev, t};
        bracket_f = {f_prev, f_new};
        bracket_g = {g_prev, g_new.clone(at::MemoryFormat::Contiguous)};
        bracket_gtd = {gtd_prev, gtd_new};
        break;
      }
      if (abs(gtd_new) <= Num(-c2) * gtd) {
        bracket = {t};
        bracket_f = {f_new};
        bracket_g = {g_new};
        done = true;
        break;
      }
      if (gtd_new >= Num(0)) {
        bracket = {t_prev, t};
        bracket_f = {f_prev, f_new};
        bracket_g = {g_prev, g_new.clone(at::MemoryFormat::Contiguous)};
        bracket_gtd = {gtd_prev, gtd_new};
        break;
      }
      // interpolate
      const Num bounds[2] = {t + Num(0.01) * (t - t_prev), t * Num(10)};
      const Num tmp = t;
      t = cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds);
      // next step
      t_prev = tmp;
      f_prev = f_new;
      g_prev = g_new.clone(at::MemoryFormat::Contiguous);
      gtd_prev = gtd_new;
      std::tie(f_new, g_new) = directional_evaluate(x, t, d);
      ls_func_evals += 1;
      gtd_new = dot(g_new, d);
      ls_iter += 1;
    }
    // reached max number of iterations?
    if (ls_iter == max_ls || bracket.empty()) {  // (empty only if max_ls < 0, never here)
      bracket = {Num(0), t};
      bracket_f = {f, f_new};
      bracket_g = {g, g_new};
    }

    // zoom phase
    bool insuf_progress = false;
    size_t low_pos = 0, high_pos = 1;
    if (!(bracket_f[0] <= bracket_f.back())) std::swap(low_pos, high_pos);
    while (!done && ls_iter < max_ls) {
      // line-search bracket is so small
      if (abs(bracket[1] - bracket[0]) * d_norm < Num(tolerance_change)) break;
      // compute new trial value
      t = cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1],
                            bracket_gtd[1]);
      // test that we are making sufficient progress
      const Num hi = py_max(bracket[0], bracket[1]), lo = py_min(bracket[0], bracket[1]);
      const Num eps = Num(0.1) * (hi - lo);
      if (py_min(hi - t, t - lo) < eps) {
        // interpolation close to boundary
        if (insuf_progress || t >= hi || t <= lo) {
          // evaluate at 0.1 away from boundary
          t = abs(t - hi) < abs(t - lo) ? hi - eps : lo + eps;
          insuf_progress = false;
        } else {
          insuf_progress = true;
        }
      } else {
        insuf_progress = false;
      }
      // Evaluate new point
      std::tie(f_new, g_new) = directional_evaluate(x, t, d);
      ls_func_evals += 1;
      gtd_new = dot(g_new, d);
      ls_iter += 1;
      if (Num(f_new) > (Num(f) + Num(c1) * t * gtd) || f_new >= bracket_f[low_pos]) {
        // Armijo condition not satisfied or not lower than lowest point
        bracket[high_pos] = t;
        bracket_f[high_pos] = f_new;
        bracket_g[high_pos] = g_new.clone(at::MemoryFormat::Contiguous);
        bracket_gtd[high_pos] = gtd_new;
        low_pos = bracket_f[0] <= bracket_f[1] ? 0 : 1;
        high_pos = 1 - low_pos;
      } else {
        if (abs(gtd_new) <= Num(-c2) * gtd) {
          // Wolfe conditions satisfied
          done = true;
        } else if (gtd_new * (bracket[high_pos] - bracket[low_pos]) >= Num(0)) {
          // old high becomes new low
          bracket[high_pos] = bracket[low_pos];
          bracket_f[high_pos] = bracket_f[low_pos];
          bracket_g[high_pos] = bracket_g[low_pos];
          bracket_gtd[high_pos] = bracket_gtd[low_pos];
        }
        // new point becomes new low
        bracket[low_pos] = t;
        bracket_f[low_pos] = f_new;
        bracket_g[low_pos] = g_new.clone(at::MemoryFormat::Contiguous);
        bracket_gtd[low_pos] = gtd_new;
      }
    }
    return {bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], ls_func_evals};
  }

  // ---- LBFGS.step
  void optimize() {
    const double tolerance_grad = opt_.tolerance_grad, tolerance_change = opt_.tolerance_change;
    const int64_t max_iter = opt_.max_iter, max_eval = opt_.max_eval;
    const int64_t history_size = opt_.history_size;

    // evaluate initial f(x) and df/dx: the host's own pass
    double loss = args_->loss;
    int64_t current_evals = 1;
    func_evals_ += 1;
    at::Tensor flat_grad = gather_flat_grad();
    bool opt_cond = abs_max(flat_grad) <= Num(tolerance_grad);
    // optimal condition
    if (opt_cond) return;
    iterated_ = true;

    History& history = *history_;
    std::vector<Num> al(static_cast<size_t>(history_size));
    int64_t n_iter = 0;
    while (n_iter < max_iter) {
      n_iter += 1;
      state_n_iter_ += 1;

      // compute gradient descent direction
      if (state_n_iter_ == 1) {
        d_ = flat_grad.neg();
        history.clear();
        h_diag_ = Num(1);
      } else {
        // do lbfgs update (update memory)
        at::Tensor y = flat_grad.sub(prev_flat_grad_);
        at::Tensor s = d_.mul(t_.v);
        const Num ys = dot(y, s);
        if (ys > Num(1e-10)) {
          // updating memory
          if (history.length() == history_size) history.pop_front();
          const Num ro = Num(1.0) / ys;
          const Num yy = dot(y, y);
          history.push_back(std::move(y), std::move(s), ro.v);
          // update scale of initial Hessian approximation
          h_diag_ = ys / yy;
        }
        // compute the approximate (L-BFGS) inverse Hessian multiplied by the gradient
        const int64_t num_old = history.length();
        at::Tensor q = flat_grad.neg();
        for (int64_t i = num_old - 1; i >= 0; --i) {
          al[i] = dot(history.stp(i), q) * Num::tensor(history.ro(i), kind_);
          q.add_(history.dir(i), (-al[i]).v);
        }
        // multiply by initial Hessian; r/d is the final direction
        at::Tensor r = q.mul(h_diag_.v);
        for (int64_t i = 0; i < num_old; ++i) {
          const Num be_i = dot(history.dir(i), r) * Num::tensor(history.ro(i), kind_);
          r.add_(history.stp(i), (al[i] - be_i).v);
        }
        d_ = r;
      }
      if (!prev_flat_grad_.defined()) {
        prev_flat_grad_ = flat_grad.clone(at::MemoryFormat::Contiguous);
      } else {
        prev_flat_grad_.copy_(flat_grad);
      }
      prev_loss_ = loss;

      // compute step length: reset initial guess for step size
      if (state_n_iter_ == 1) {
        t_ = py_min(Num(1.0), Num(1.0) / num(flat_grad.abs().sum())) * Num(lr_);
      } else {
        t_ = Num(lr_);
      }
      // directional derivative
      const Num gtd = dot(flat_grad, d_);
      // directional derivative is below tolerance
      if (gtd > -Num(tolerance_change)) break;

      int64_t ls_func_evals = 0;
      if (opt_.strong_wolfe) {
        const std::vector<at::Tensor> x_init = clone_params();
        LineSearch ls = strong_wolfe(x_init, t_, d_, loss, flat_grad, gtd,
                                     /*max_ls=*/max_eval - current_evals);
        loss = ls.f_new;
        flat_grad = std::move(ls.g_new);
        t_ = ls.t;
        ls_func_evals = ls.ls_func_evals;
        add_grad(t_, d_);
        opt_cond = abs_max(flat_grad) <= Num(tolerance_grad);
      } else {
        // no line search, simply move with fixed-step
        add_grad(t_, d_);
        if (n_iter != max_iter) {
          // re-evaluate function only if not in last iteration
          loss = closure();
          flat_grad = gather_flat_grad();
          opt_cond = abs_max(flat_grad) <= Num(tolerance_grad);
          ls_func_evals = 1;
        }
      }
      // update func eval
      current_evals += ls_func_evals;
      func_evals_ += ls_func_evals;

      // check conditions
      if (n_iter == max_iter) break;
      if (current_evals >= max_eval) break;
      // optimal condition
      if (opt_cond) break;
      // lack of progress
      if (abs_max(d_.mul(t_.v)) <= Num(tolerance_change)) break;
      if (std::fabs(loss - prev_loss_) < tolerance_change) break;
    }
  }

  const Lbfgs& opt_;
  const kiln_optimizer_step_args* args_;
  std::vector<Slot> slots_;
  double lr_ = 0.0;
  int kind_ = Num::kFloat32;
  std::vector<at::Tensor> saved_;  // the weights as the step found them
  // torch's state during the step, written back by commit()
  std::vector<at::Tensor> scalars_;  // the SCALAR_F64 state, in read_state's order
  at::Tensor ro_state_;
  std::unique_ptr<History> history_;
  int64_t state_n_iter_ = 0, func_evals_ = 0;
  Num t_, h_diag_;
  double prev_loss_ = 0.0;
  at::Tensor d_, prev_flat_grad_;
  bool iterated_ = false;
};

kiln_status* lbfgs_create(const kiln_host_api* host, const kiln_options* options, void** out) {
  return KILN_GUARD(host, {
    if (!KILN_HAS_FIELD(host, kiln_host_api, state_tensor_shaped) ||
        host->state_tensor_shaped == nullptr || host->reevaluate == nullptr) {
      throw kiln::Error(KILN_ERR_UNSUPPORTED,
                        "lbfgs: the host is older than Kiln ABI 1.14 (it cannot evaluate the "
                        "model again inside a step, nor keep the history's state)");
    }
    auto opt = std::make_unique<Lbfgs>();
    opt->host = host;
    opt->max_iter = kiln_options_int(options, "max_iter", 20);
    const int64_t max_eval = kiln_options_int(options, "max_eval", 0);
    opt->tolerance_grad = kiln_options_float(options, "tolerance_grad", 1e-7);
    opt->tolerance_change = kiln_options_float(options, "tolerance_change", 1e-9);
    opt->history_size = kiln_options_int(options, "history_size", 100);
    const std::string line_search = kiln_options_string(options, "line_search_fn", "none");
    kiln::optim::check_range(kName, "max_iter", static_cast<double>(opt->max_iter), 1.0, false,
                             HUGE_VAL, false);
    kiln::optim::check_range(kName, "max_eval (0: max_iter * 5 / 4)", static_cast<double>(max_eval),
                             0.0, false, HUGE_VAL, false);
    kiln::optim::check_range(kName, "tolerance_grad", opt->tolerance_grad, 0.0, false, HUGE_VAL,
                             false);
    kiln::optim::check_range(kName, "tolerance_change", opt->tolerance_change, 0.0, false, HUGE_VAL,
                             false);
    kiln::optim::check_range(kName, "history_size", static_cast<double>(opt->history_size), 1.0,
                             false, HUGE_VAL, false);
    if (line_search != "none" && line_search != "strong_wolfe") {
      kiln::optim::invalid(kName, "line_search_fn must be \"none\" or \"strong_wolfe\", got \"" +
                                      line_search + "\"");
    }
    opt->strong_wolfe = line_search == "strong_wolfe";
    // torch: max_eval = max_iter * 5 // 4 when None; at least the first evaluation.
    opt->max_eval = max_eval != 0 ? max_eval : opt->max_iter * 5 / 4;
    *out = opt.release();
  });
}

void lbfgs_destroy(void* instance) { delete static_cast<Lbfgs*>(instance); }

kiln_status* lbfgs_step_all(void* instance, const kiln_optimizer_step_args* args) {
  const Lbfgs& opt = *static_cast<const Lbfgs*>(instance);
  return KILN_GUARD(opt.host, { Step(opt, args).run(); });
}

const kiln_optimizer_vtable kVtable =
    KILN_OPTIMIZER_VTABLE_FULL_INIT(lbfgs_create, lbfgs_destroy, nullptr, nullptr, lbfgs_step_all);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_MIN_INIT("max_iter", KILN_OPT_INT, 1.0, "20",
                         "iterations per optimizer step, >= 1"),
    KILN_OPTION_MIN_INIT("max_eval", KILN_OPT_INT, 0.0, "0",
                         "evaluations per optimizer step (the host's pass included); 0: "
                         "max_iter * 5 / 4 (torch's None)"),
    KILN_OPTION_MIN_INIT("tolerance_grad", KILN_OPT_FLOAT, 0.0, "1e-7",
                         "stop when the largest gradient element is at most this, >= 0"),
    KILN_OPTION_MIN_INIT("tolerance_change", KILN_OPT_FLOAT, 0.0, "1e-9",
                         "stop when the step or the loss changes by less than this, >= 0"),
    KILN_OPTION_MIN_INIT("history_size", KILN_OPT_INT, 1.0, "100",
                         "update pairs kept (state of history_size x the parameters, twice), >= 1"),
    KILN_OPTION_CHOICES_INIT("line_search_fn", "none,strong_wolfe", "\"none\"",
                             "line search: none (step lr) or strong_wolfe (torch's)"),
};

constexpr uint64_t kCapsFlags = KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32 |
                                KILN_CAP_DTYPE_F64 | KILN_CAP_MULTI_TENSOR;
const kiln_capabilities kCaps = KILN_CAPABILITIES_INIT(kCapsFlags);

const kiln_component_descriptor kLbfgs = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_OPTIMIZER, "lbfgs", KILN_VERSION_INIT(1, 0, 0),
    "L-BFGS as torch.optim.LBFGS: every parameter one vector, re-evaluations for its closure",
    &kCaps, kOptions, &kVtable);

const kiln_component_descriptor* const kComponents[] = {&kLbfgs};

const kiln_plugin_descriptor kDescriptor =
    KILN_PLUGIN_DESCRIPTOR_INIT("kiln-lbfgs", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace

KILN_DEFINE_PLUGIN_PROBE()

KILN_EXTERN_C const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
