#include "harness.hpp"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "kiln/torch.hpp"

namespace kiln::test {
namespace {

OptionValue f(const std::string& name, double value) { return {name, false, value}; }
OptionValue b(const std::string& name, bool value) { return {name, true, value ? 1.0 : 0.0}; }

std::vector<Case> sgd_cases() {
  auto c = [](std::string name, double m, double d, bool nesterov, double wd) {
    return Case{"sgd_" + name,
                "kiln_sgd",
                "sgd",
                {f("momentum", m), f("dampening", d), b("nesterov", nesterov)},
                wd,
                0.05};
  };
  return {c("plain", 0.0, 0.0, false, 0.0),         c("wd", 0.0, 0.0, false, 1e-2),
          c("momentum", 0.9, 0.0, false, 0.0),      c("momentum_wd", 0.9, 0.0, false, 5e-4),
          c("dampening_wd", 0.8, 0.3, false, 1e-2), c("nesterov", 0.9, 0.0, true, 0.0),
          c("nesterov_wd", 0.7, 0.0, true, 1e-2)};
}

std::vector<Case> rmsprop_cases() {
  auto c = [](std::string name, double alpha, double eps, double m, bool centered, double wd) {
    return Case{"rmsprop_" + name,
                "kiln_rmsprop",
                "rmsprop",
                {f("alpha", alpha), f("eps", eps), f("momentum", m), b("centered", centered)},
                wd,
                0.01};
  };
  return {c("default", 0.99, 1e-8, 0.0, false, 0.0),
          c("wd", 0.99, 1e-8, 0.0, false, 1e-2),
          c("momentum", 0.99, 1e-8, 0.9, false, 0.0),
          c("centered", 0.99, 1e-8, 0.0, true, 0.0),
          c("centered_momentum_wd", 0.95, 1e-8, 0.5, true, 1e-2),
          c("alpha_eps", 0.9, 1e-6, 0.0, false, 0.0)};
}

std::vector<Case> adam_cases(const std::string& component) {
  auto c = [&](std::string name, double b1, double b2, double eps, bool amsgrad, double wd) {
    return Case{component + "_" + name,
                "kiln_adam",
                component,
                {f("beta1", b1), f("beta2", b2), f("eps", eps), b("amsgrad", amsgrad)},
                wd,
                0.01};
  };
  return {c("default", 0.9, 0.999, 1e-8, false, 0.0), c("wd", 0.9, 0.999, 1e-8, false, 1e-2),
          c("amsgrad", 0.9, 0.999, 1e-8, true, 0.0), c("amsgrad_wd", 0.9, 0.999, 1e-8, true, 1e-2),
          c("betas_eps", 0.8, 0.99, 1e-6, false, 5e-2)};
}

std::vector<Case> lamb_cases() {
  auto c = [](std::string name, double b1, double b2, double eps, double clip, bool bc, double wd) {
    return Case{"lamb_" + name,
                "kiln_lamb",
                "lamb",
                {f("beta1", b1), f("beta2", b2), f("eps", eps), f("max_grad_norm", clip),
                 b("bias_correction", bc)},
                wd,
                0.01};
  };
  // The gradients' global norm is about 14: max_grad_norm 1 clips, 100 does not.
  return {c("default", 0.9, 0.999, 1e-6, 0.0, true, 0.0),
          c("wd", 0.9, 0.999, 1e-6, 0.0, true, 1e-2),
          c("clip_wd", 0.9, 0.999, 1e-6, 1.0, true, 1e-2),
          c("clip_inactive", 0.9, 0.999, 1e-6, 100.0, true, 0.0),
          c("no_bias_correction", 0.8, 0.99, 1e-6, 0.0, false, 1e-2)};
}

std::vector<Case> nadam_cases() {
  auto c = [](std::string name, double b1, double b2, double eps, double momentum_decay,
              bool decoupled, double wd) {
    return Case{"nadam_" + name,
                "kiln_adam_family",
                "nadam",
                {f("beta1", b1), f("beta2", b2), f("eps", eps), f("momentum_decay", momentum_decay),
                 b("decoupled_weight_decay", decoupled)},
                wd,
                0.01};
  };
  return {c("default", 0.9, 0.999, 1e-8, 4e-3, false, 0.0),
          c("wd", 0.9, 0.999, 1e-8, 4e-3, false, 1e-2),
          c("decoupled_wd", 0.9, 0.999, 1e-8, 4e-3, true, 1e-2),
          c("betas_momentum_decay", 0.8, 0.99, 1e-6, 1e-2, false, 5e-2)};
}

std::vector<Case> radam_cases() {
  auto c = [](std::string name, double b1, double b2, double eps, bool decoupled, double wd) {
    return Case{
        "radam_" + name,
        "kiln_adam_family",
        "radam",
        {f("beta1", b1), f("beta2", b2), f("eps", eps), b("decoupled_weight_decay", decoupled)},
        wd,
        0.01};
  };
  // Steps 1 to 5 are unrectified (rho_t <= 5), the later ones rectified.
  return {c("default", 0.9, 0.999, 1e-8, false, 0.0), c("wd", 0.9, 0.999, 1e-8, false, 1e-2),
          c("decoupled_wd", 0.9, 0.999, 1e-8, true, 1e-2),
          c("betas_eps", 0.8, 0.99, 1e-6, false, 5e-2)};
}

std::vector<Case> adamax_cases() {
  auto c = [](std::string name, double b1, double b2, double eps, double wd) {
    return Case{"adamax_" + name,
                "kiln_adam_family",
                "adamax",
                {f("beta1", b1), f("beta2", b2), f("eps", eps)},
                wd,
                0.01};
  };
  return {c("default", 0.9, 0.999, 1e-8, 0.0), c("wd", 0.9, 0.999, 1e-8, 1e-2),
          c("betas_eps", 0.8, 0.99, 1e-6, 5e-2)};
}

std::vector<Case> adagrad_cases() {
  auto c = [](std::string name, double lr_decay, double initial, double eps, double wd) {
    return Case{"adagrad_" + name,
                "kiln_adaptive",
                "adagrad",
                {f("lr_decay", lr_decay), f("initial_accumulator_value", initial), f("eps", eps)},
                wd,
                0.01};
  };
  return {c("default", 0.0, 0.0, 1e-10, 0.0), c("wd", 0.0, 0.0, 1e-10, 1e-2),
          c("lr_decay", 1e-2, 0.0, 1e-10, 0.0), c("initial_eps_wd", 1e-3, 0.1, 1e-6, 1e-2)};
}

std::vector<Case> adadelta_cases() {
  auto c = [](std::string name, double rho, double eps, double wd, double lr) {
    return Case{
        "adadelta_" + name, "kiln_adaptive", "adadelta", {f("rho", rho), f("eps", eps)}, wd, lr};
  };
  // torch's default lr for Adadelta is 1.0.
  return {c("default", 0.9, 1e-6, 0.0, 1.0), c("wd", 0.9, 1e-6, 1e-2, 1.0),
          c("rho_eps", 0.95, 1e-4, 0.0, 0.5)};
}

std::vector<Case> adafactor_cases() {
  auto c = [](std::string name, double beta2_decay, double eps1, double eps2, double d, double wd) {
    return Case{"adafactor_" + name,
                "kiln_adaptive",
                "adafactor",
                {f("beta2_decay", beta2_decay), f("eps1", eps1), f("eps2", eps2), f("d", d)},
                wd,
                0.01};
  };
  // eps1 -1: torch's None (float32's epsilon). Matrices and the conv weight keep factored state,
  // the vector and the one-element tensor a full one.
  return {c("default", -0.8, -1.0, 1e-3, 1.0, 0.0), c("wd", -0.8, -1.0, 1e-3, 1.0, 1e-2),
          c("eps_d", -0.5, 1e-3, 1e-2, 1.5, 0.0)};
}

std::vector<Case> asgd_cases() {
  auto c = [](std::string name, double lambd, double alpha, double t0, double wd) {
    return Case{"asgd_" + name,
                "kiln_classic",
                "asgd",
                {f("lambd", lambd), f("alpha", alpha), f("t0", t0)},
                wd,
                0.01};
  };
  // t0 20 and 0: ax averages the iterates for most of the 100 steps (at 1e6 it copies them).
  return {c("default", 1e-4, 0.75, 1e6, 0.0), c("wd", 1e-4, 0.75, 1e6, 1e-2),
          c("averaging", 1e-2, 0.5, 20.0, 0.0), c("averaging_wd", 1e-3, 1.0, 0.0, 5e-3)};
}

std::vector<Case> rprop_cases() {
  auto c = [](std::string name, double etaminus, double etaplus, double lo, double hi) {
    return Case{"rprop_" + name,
                "kiln_classic",
                "rprop",
                {f("etaminus", etaminus), f("etaplus", etaplus), f("step_size_min", lo),
                 f("step_size_max", hi)},
                0.0,  // torch.optim.Rprop has no weight decay
                0.01};
  };
  // The narrow range clamps the step sizes at both ends.
  return {c("default", 0.5, 1.2, 1e-6, 50.0), c("narrow", 0.3, 1.5, 1e-3, 0.05)};
}

}  // namespace

const kiln_optimizer_vtable& optimizer_vtable(const std::string& library,
                                              const std::string& component) {
  return *static_cast<const kiln_optimizer_vtable*>(component_vtable(library, component));
}

std::vector<Case> cases_for(const std::string& family) {
  if (family == "sgd") return sgd_cases();
  if (family == "rmsprop") return rmsprop_cases();
  if (family == "adam" || family == "adamw") return adam_cases(family);
  if (family == "lamb") return lamb_cases();
  if (family == "nadam") return nadam_cases();
  if (family == "radam") return radam_cases();
  if (family == "adamax") return adamax_cases();
  if (family == "adagrad") return adagrad_cases();
  if (family == "adadelta") return adadelta_cases();
  if (family == "adafactor") return adafactor_cases();
  if (family == "asgd") return asgd_cases();
  if (family == "rprop") return rprop_cases();
  throw std::runtime_error("no optimizer family " + family);
}

Options options_of(const Case& c) {
  Options o;
  for (const OptionValue& v : c.options) {
    if (v.is_bool) {
      o.set_bool(v.name, v.value != 0.0);
    } else {
      o.set_float(v.name, v.value);
    }
  }
  return o;
}

double lr_at(const Case& c, int64_t s) {
  return c.base_lr * (1.0 - 0.004 * static_cast<double>(s));
}

std::string case_json(const Case& c, int64_t steps) {
  std::ostringstream out;
  out.precision(17);
  out << "{\"name\": \"" << c.name << "\", \"optimizer\": \"" << c.component
      << "\", \"weight_decay\": " << c.weight_decay << ", \"options\": {";
  for (size_t i = 0; i < c.options.size(); ++i) {
    const OptionValue& v = c.options[i];
    out << (i ? ", " : "") << "\"" << v.name << "\": ";
    if (v.is_bool) {
      out << (v.value != 0.0 ? "true" : "false");
    } else {
      out << v.value;
    }
  }
  out << "}, \"lrs\": [";
  for (int64_t s = 0; s < steps; ++s) out << (s ? ", " : "") << lr_at(c, s);
  out << "]}";
  return out.str();
}

Trajectory make_trajectory(int64_t steps, uint64_t seed) {
  at::manual_seed(seed);
  Trajectory t;
  t.steps = steps;
  // The last one is large enough (≥ at::internal::GRAIN_SIZE elements) for the fused kernels to
  // step it with the intra-op team; the others go on the calling thread alone.
  t.shapes = {{5, 7}, {4, 3, 3, 3}, {13}, {1}, {6, 5}, {40, 1000}};
  for (const auto& shape : t.shapes) {
    t.initial.push_back(at::randn(shape));
    std::vector<int64_t> grad_shape = {steps};
    grad_shape.insert(grad_shape.end(), shape.begin(), shape.end());
    t.grads.push_back(at::randn(grad_shape));
  }
  return t;
}

ParamSet make_params(const Trajectory& t, at::Device device, at::ScalarType dtype) {
  const auto options = at::TensorOptions().device(device).dtype(dtype);
  ParamSet set;
  for (size_t i = 0; i < t.shapes.size(); ++i) {
    at::Tensor p;
    if (i == 0) {
      p = at::empty({t.shapes[0][1], t.shapes[0][0]}, options).t();
    } else if (i == 4) {
      set.base = at::full({t.shapes[4][0], 2 * t.shapes[4][1]}, ParamSet::kFiller, options);
      p = set.base.slice(1, 0, 2 * t.shapes[4][1], 2);
    } else {
      p = at::empty(t.shapes[i], options);
    }
    p.copy_(t.initial[i]);
    set.params.push_back(p);
  }
  return set;
}

std::string run_steps(const kiln_optimizer_vtable& vt, void* instance, kiln_call_context& ctx,
                      const Case& c, const std::vector<at::Tensor>& params,
                      const std::vector<at::Tensor>& grads, int64_t first, int64_t count,
                      const CallMode& mode) {
  std::vector<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) names.push_back("p" + std::to_string(i));
  std::vector<const char*> name_ptrs;
  for (const auto& n : names) name_ptrs.push_back(n.c_str());
  ctx.params = params;
  for (int64_t step = first; step < first + count; ++step) {
    std::vector<at::Tensor> grad_views;
    std::vector<DLTensor> p_dl, g_dl;
    for (size_t i = 0; i < params.size(); ++i) {
      if (mode.grad_memory != nullptr) {
        grad_views.push_back((*mode.grad_memory)[i].copy_(grads[i][step]));
      } else {
        grad_views.push_back(grads[i][step].to(params[i].scalar_type()));
      }
      p_dl.push_back(kiln::as_dltensor(params[i]));
      g_dl.push_back(kiln::as_dltensor(grad_views.back()));
    }
    ctx.grads = grad_views;
    kiln_param_group group{};
    group.struct_size = sizeof(group);
    group.count = params.size();
    group.params = p_dl.data();
    group.grads = g_dl.data();
    group.names = name_ptrs.data();
    group.step = step + 1;
    group.lr = lr_at(c, step);
    group.weight_decay = c.weight_decay;
    group.reuse_token = mode.reuse_token;
    at::Tensor lr, found_inf;
    DLTensor lr_dl{}, found_inf_dl{};
    if (mode.device_scalars) {
      const auto f32 = at::TensorOptions().dtype(at::kFloat).device(params[0].device());
      lr = at::full({}, group.lr, f32);
      found_inf = at::full({}, mode.found_inf, f32);
      lr_dl = kiln::as_dltensor(lr);
      found_inf_dl = kiln::as_dltensor(found_inf);
      group.lr_tensor = &lr_dl;
      group.found_inf = &found_inf_dl;
      group.lr = 1e9;  // stale in a replay: a capturable call must not use it
    }
    Status status = take(vt.step(instance, &ctx, &group));
    if (status != nullptr) return "step " + std::to_string(step) + ": " + describe(status.get());
  }
  return "";
}

double relative_error(const at::Tensor& actual, const at::Tensor& expected) {
  at::Tensor a = actual.detach().cpu().to(at::kDouble);
  at::Tensor e = expected.detach().cpu().to(at::kDouble);
  if (a.sizes() != e.sizes()) throw std::runtime_error("relative_error: shapes differ");
  const double scale = std::max(1.0, e.abs().max().item<double>());
  return (a - e).abs().max().item<double>() / scale;
}

Instance::Instance(const kiln_optimizer_vtable& vt, Options& options) : vt_(vt) {
  Status status = take(vt.create(fake_host(), options.get(), &instance_));
  error_ = describe(status.get());
}

Instance::~Instance() { vt_.destroy(instance_); }

}  // namespace kiln::test
