// The muon and soap plugins against their Python references (tests/oracle/optim_muon_soap.py):
// torch.optim.Muon of torch 2.11 over 100 steps of matrices of their own (tall, wide, square,
// one of more than 1000 elements, a transposed and a non-dense view), and
// pytorch_optimizer.SOAP of pytorch-optimizer 4.1.0 over 100 steps of the shared trajectory
// (harness.hpp: a matrix, a conv weight, a vector, a one-element tensor, a non-dense view and a
// 40x1000 matrix), several configurations each. The parameters and every state tensor (SOAP's
// GG and Q as one d x d tensor per basis, "GG.<k>" and "Q.<k>" for the reference's
// state["GG"][k] and state["Q"][k]) must agree within kTolerance. Every run is cut in two by a
// checkpoint: the state goes through the host's save and restore (contiguous, then back in the
// parameter's layout) and a new instance goes on, so nothing may live in the plugin instance. Plus
// the plugins' contract: descriptors, refused options, Muon's refusal of parameters that are not
// matrices, SOAP's refusal of merges the reference cannot do.
#include <ATen/Context.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "kiln/torch.hpp"
#include "tensor_scratch.hpp"

namespace kiln::test {
namespace {

constexpr int64_t kSteps = 100;
// Both plugins run the reference's ATen ops in its order on operands of its layouts (and pass
// Python floats as torch's Python API does), so on the CPU they agree with it exactly: 0 measured
// for every parameter and state tensor, float32 and bfloat16, Muon's bfloat16 Newton-Schulz and
// SOAP's eigh and QR included (2-core x86 VM, torch 2.11). The bound is the other optimizers'
// (oracle_test.cpp). The CUDA run (the references on CUDA too) has not been measured yet.
constexpr double kTolerance = 1e-6;
// The step after which every run is checkpointed and resumed by a new instance.
constexpr int64_t kCheckpointAt = 37;

// A case with the options harness.hpp's Case cannot hold.
struct OracleCase {
  Case c;  // name, library, component, bool and float options, weight decay, base lr
  std::vector<std::pair<std::string, int64_t>> ints;
  std::vector<std::pair<std::string, std::string>> strings;
  std::string set;  // "muon" or "soap": the trajectory
  at::ScalarType dtype = at::kFloat;
};

OptionValue f(const std::string& name, double value) { return {name, false, value}; }
OptionValue b(const std::string& name, bool value) { return {name, true, value ? 1.0 : 0.0}; }

std::vector<OracleCase> muon_cases() {
  auto c = [](std::string name, std::vector<OptionValue> options, double wd,
              std::vector<std::pair<std::string, int64_t>> ints = {},
              std::string adjust = "original") {
    return OracleCase{Case{"muon_" + name, "kiln_muon", "muon", std::move(options), wd, 0.02},
                      std::move(ints),
                      {{"adjust_lr_fn", std::move(adjust)}},
                      "muon"};
  };
  std::vector<OracleCase> out = {
      c("default", {}, 0.1),
      c("plain_momentum", {f("momentum", 0.9), b("nesterov", false)}, 0.0),
      c("match_rms_adamw", {f("momentum", 0.8)}, 1e-2, {}, "match_rms_adamw"),
      c("coefficients",
        {f("ns_a", 2.0), f("ns_b", -1.5), f("ns_c", 0.5), f("eps", 1e-5), b("nesterov", false)},
        5e-2, {{"ns_steps", 3}}),
  };
  // bfloat16 parameters (nesterov: without it torch 2.11 renormalises a bfloat16 momentum buffer
  // in place, which the plugin does not copy; see muon.cpp).
  OracleCase bf16 = c("bf16", {}, 0.1);
  bf16.dtype = at::kBFloat16;
  out.push_back(bf16);
  return out;
}

std::vector<OracleCase> soap_cases() {
  auto c = [](std::string name, std::vector<OptionValue> options, double wd,
              std::vector<std::pair<std::string, int64_t>> ints = {},
              std::string format = "channels_first") {
    return OracleCase{Case{"soap_" + name, "kiln_soap", "soap", std::move(options), wd, 3e-3},
                      std::move(ints),
                      {{"data_format", std::move(format)}},
                      "soap"};
  };
  std::vector<OracleCase> out = {
      c("default", {}, 1e-2),
      c("frequent_normalized",
        {f("shampoo_beta", 0.9), b("correct_bias", false), b("normalize_gradient", true),
         f("eps", 1e-6)},
        5e-2, {{"precondition_frequency", 3}}),
      // Vectors get bases; the 40x1000 matrix's 1000 stays unrotated.
      c("precondition_1d", {f("beta1", 0.9), f("beta2", 0.99), b("precondition_1d", true)}, 0.0,
        {{"max_precondition_dim", 100}}),
      // 5x7 -> [5, 7], 4x3x3x3 -> [4, 9, 3], 13 -> [1, 13], 40x1000 -> [1, 40, 1000].
      c("merge_channels_last", {b("merge_dims", true)}, 1e-2,
        {{"max_precondition_dim", 10}, {"precondition_frequency", 4}}, "channels_last"),
  };
  // bfloat16 parameters: eigh (which takes no bfloat16) in float64, QR in float32; a decay
  // factor (1 - 1.5e-3) that bfloat16 cannot hold.
  OracleCase bf16 = c("bf16", {b("normalize_gradient", true)}, 0.5);
  bf16.dtype = at::kBFloat16;
  out.push_back(bf16);
  return out;
}

const kiln_component_descriptor& descriptor_of(const Case& c) {
  const kiln_component_descriptor* d = builtin(c.library).component(c.component);
  if (d == nullptr) throw std::runtime_error("no component " + c.component);
  return *d;
}

// The options as the host hands them over: the case's, then every other at its default.
Options options_for(const OracleCase& oc) {
  Options o = options_of(oc.c);
  for (const auto& [name, value] : oc.ints) o.set_int(name, value);
  for (const auto& [name, value] : oc.strings) o.set_string(name, value);
  o.fill_defaults(descriptor_of(oc.c));
  return o;
}

// The case for the oracle: only the options it sets, so the reference's defaults meet the
// plugin's.
std::string oracle_json(const OracleCase& oc, int64_t steps) {
  std::ostringstream out;
  out.precision(17);
  out << "{\"name\": \"" << oc.c.name << "\", \"optimizer\": \"" << oc.c.component
      << "\", \"set\": \"" << oc.set << "\", \"dtype\": \""
      << (oc.dtype == at::kBFloat16 ? "bfloat16" : "float32")
      << "\", \"weight_decay\": " << oc.c.weight_decay << ", \"options\": {";
  bool first = true;
  auto key = [&](const std::string& name) {
    out << (first ? "" : ", ") << "\"" << name << "\": ";
    first = false;
  };
  for (const OptionValue& v : oc.c.options) {
    key(v.name);
    if (v.is_bool) {
      out << (v.value != 0.0 ? "true" : "false");
    } else {
      out << v.value;
    }
  }
  for (const auto& [name, value] : oc.ints) {
    key(name);
    out << value;
  }
  for (const auto& [name, value] : oc.strings) {
    key(name);
    out << "\"" << value << "\"";
  }
  out << "}, \"lrs\": [";
  for (int64_t s = 0; s < steps; ++s) out << (s ? ", " : "") << lr_at(oc.c, s);
  out << "]}";
  return out.str();
}

// Muon's matrices: tall, wide, square, 48x96 (4608 elements, the intra-op team's size), a tall
// one held as a transposed view and a wide one as every other column of a larger matrix.
Trajectory muon_trajectory(int64_t steps, uint64_t seed) {
  at::manual_seed(seed);
  Trajectory t;
  t.steps = steps;
  t.shapes = {{64, 16}, {12, 40}, {24, 24}, {48, 96}, {30, 10}, {9, 14}};
  for (const auto& shape : t.shapes) {
    t.initial.push_back(at::randn(shape));
    std::vector<int64_t> grad_shape = {steps};
    grad_shape.insert(grad_shape.end(), shape.begin(), shape.end());
    t.grads.push_back(at::randn(grad_shape));
  }
  return t;
}

ParamSet muon_params(const Trajectory& t, at::Device device, at::ScalarType dtype) {
  const auto options = at::TensorOptions().device(device).dtype(dtype);
  ParamSet set;
  for (size_t i = 0; i < t.shapes.size(); ++i) {
    const std::vector<int64_t>& shape = t.shapes[i];
    at::Tensor p;
    if (i == 4) {
      p = at::empty({shape[1], shape[0]}, options).t();
    } else if (i == 5) {
      set.base = at::full({shape[0], 2 * shape[1]}, ParamSet::kFiller, options);
      p = set.base.slice(1, 0, 2 * shape[1], 2);
    } else {
      p = at::empty(shape, options);
    }
    p.copy_(t.initial[i]);
    set.params.push_back(p);
  }
  return set;
}

// The state as a checkpoint keeps it and a restore gives it back (engine/optimizer_side.cpp):
// contiguous, then in its parameter's layout where that is dense and of the same shape.
kiln_call_context checkpointed(const kiln_call_context& ctx) {
  kiln_call_context out;
  out.params = ctx.params;
  for (const auto& [key, t] : ctx.state) {
    at::Tensor saved = t.contiguous().clone();
    const at::Tensor& p = ctx.params[key.first];
    if (p.sizes() == saved.sizes() && p.is_non_overlapping_and_dense()) {
      saved = at::empty_like(p, saved.options()).copy_(saved);
    }
    out.state.emplace(key, saved);
  }
  return out;
}

std::set<std::string> split(const std::string& text) {
  std::set<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.insert(item);
  }
  return out;
}

std::vector<int64_t> split_ints(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(std::stoll(item));
  }
  return out;
}

// The largest error seen per kind of tensor, for the log.
struct Worst {
  std::map<std::string, double> by_kind;
  void note(const std::string& kind, double e) { by_kind[kind] = std::max(by_kind[kind], e); }
};

void compare_soap_state(const kiln_call_context& ctx, const TensorScratch& oracle,
                        const std::string& prefix, size_t i, const at::Tensor& param,
                        Worst& worst) {
  const std::string n = std::to_string(i);
  const std::vector<int64_t> dims = split_ints(oracle.read_text(prefix + "dims" + n + ".txt"));
  std::set<std::string> expected = {"exp_avg", "exp_avg_sq"};
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] == 0) continue;
    expected.insert("GG." + std::to_string(k));
    expected.insert("Q." + std::to_string(k));
  }
  std::set<std::string> kiln_names;
  for (const auto& [key, value] : ctx.state) {
    if (key.first == i) kiln_names.insert(key.second);
  }
  EXPECT_EQ(kiln_names, expected) << "state names of parameter " << n;
  EXPECT_EQ(split(oracle.read_text(prefix + "state" + n + ".txt")),
            (std::set<std::string>{"exp_avg", "exp_avg_sq"}));
  for (const char* name : {"exp_avg", "exp_avg_sq"}) {
    auto it = ctx.state.find({i, name});
    if (it == ctx.state.end()) continue;
    const double e =
        relative_error(it->second, oracle.read(prefix + name + n + ".bin", param.sizes()));
    worst.note(name, e);
    EXPECT_LE(e, kTolerance) << name << " of parameter " << n;
  }
  for (size_t d = 0; d < dims.size(); ++d) {
    const int64_t size = dims[d];
    if (size == 0) continue;
    const auto gg = ctx.state.find({i, "GG." + std::to_string(d)});
    const auto q = ctx.state.find({i, "Q." + std::to_string(d)});
    if (gg == ctx.state.end() || q == ctx.state.end()) continue;  // the names' check failed
    EXPECT_EQ(gg->second.sizes(), at::IntArrayRef({size, size})) << "GG." << d << " of " << n;
    EXPECT_EQ(q->second.sizes(), at::IntArrayRef({size, size})) << "Q." << d << " of " << n;
    if (gg->second.sizes() != at::IntArrayRef({size, size}) ||
        q->second.sizes() != at::IntArrayRef({size, size})) {
      continue;
    }
    const std::string suffix = n + "_" + std::to_string(d) + ".bin";
    const double e_gg =
        relative_error(gg->second, oracle.read(prefix + "GG" + suffix, {size, size}));
    // Q is kept transposed (column-major, as LAPACK returns it).
    const double e_q =
        relative_error(q->second.t(), oracle.read(prefix + "Q" + suffix, {size, size}));
    worst.note("GG", e_gg);
    worst.note("Q", e_q);
    EXPECT_LE(e_gg, kTolerance) << "GG of parameter " << n << ", dimension " << d;
    EXPECT_LE(e_q, kTolerance) << "Q of parameter " << n << ", dimension " << d;
  }
}

void compare_with_references(at::Device device) {
  std::vector<OracleCase> cases = muon_cases();
  for (OracleCase& c : soap_cases()) cases.push_back(std::move(c));
  const std::map<std::string, Trajectory> sets = {{"muon", muon_trajectory(kSteps, 2026)},
                                                  {"soap", make_trajectory(kSteps, 2027)}};

  TensorScratch oracle;
  std::ostringstream config;
  config << "{\"device\": \"" << (device.is_cuda() ? "cuda" : "cpu") << "\", \"sets\": {";
  bool first_set = true;
  for (const auto& [name, traj] : sets) {
    config << (first_set ? "" : ", ") << "\"" << name << "\": {\"steps\": " << traj.steps
           << ", \"shapes\": [";
    first_set = false;
    for (size_t i = 0; i < traj.shapes.size(); ++i) {
      oracle.write(name + "_p" + std::to_string(i) + ".bin", traj.initial[i]);
      oracle.write(name + "_g" + std::to_string(i) + ".bin", traj.grads[i]);
      config << (i ? ", " : "") << "[";
      for (size_t d = 0; d < traj.shapes[i].size(); ++d) {
        config << (d ? ", " : "") << traj.shapes[i][d];
      }
      config << "]";
    }
    config << "]}";
  }
  config << "}, \"cases\": [";
  for (size_t k = 0; k < cases.size(); ++k) {
    config << (k ? ", " : "") << oracle_json(cases[k], sets.at(cases[k].set).steps);
  }
  config << "]}";
  oracle.write_text("config.json", config.str());
  oracle.run("optim_muon_soap.py");

  Worst worst;
  for (const OracleCase& oc : cases) {
    SCOPED_TRACE(oc.c.name);
    const Trajectory& traj = sets.at(oc.set);
    std::vector<at::Tensor> grads;
    for (const at::Tensor& g : traj.grads) grads.push_back(g.to(device));
    const kiln_optimizer_vtable& vt = optimizer_vtable(oc.c.library, oc.c.component);
    ParamSet set = oc.set == "muon" ? muon_params(traj, device, oc.dtype)
                                    : make_params(traj, device, oc.dtype);
    kiln_call_context ctx;
    {
      Options options = options_for(oc);
      Instance instance(vt, options);
      ASSERT_EQ(instance.error(), "");
      ASSERT_EQ(run_steps(vt, instance.get(), ctx, oc.c, set.params, grads, 0, kCheckpointAt), "");
    }
    kiln_call_context resumed = checkpointed(ctx);
    {
      Options options = options_for(oc);
      Instance instance(vt, options);
      ASSERT_EQ(instance.error(), "");
      ASSERT_EQ(run_steps(vt, instance.get(), resumed, oc.c, set.params, grads, kCheckpointAt,
                          traj.steps - kCheckpointAt),
                "");
    }

    EXPECT_TRUE(set.base.slice(1, 1, set.base.size(1), 2).eq(ParamSet::kFiller).all().item<bool>())
        << "wrote outside the strided parameter view";
    const std::string prefix = oc.c.name + "_";
    for (size_t i = 0; i < traj.shapes.size(); ++i) {
      const std::string n = std::to_string(i);
      const double e =
          relative_error(set.params[i], oracle.read(prefix + "p" + n + ".bin", traj.shapes[i]));
      worst.note(oc.c.component + " param", e);
      EXPECT_LE(e, kTolerance) << "parameter " << n;
      if (oc.c.component == "soap") {
        compare_soap_state(resumed, oracle, prefix, i, set.params[i], worst);
        continue;
      }
      std::set<std::string> kiln_names;
      for (const auto& [key, value] : resumed.state) {
        if (key.first == i) kiln_names.insert(key.second);
      }
      const std::set<std::string> torch_names =
          split(oracle.read_text(prefix + "state" + n + ".txt"));
      EXPECT_EQ(kiln_names, torch_names) << "state names of parameter " << n;
      for (const std::string& name : torch_names) {
        auto it = resumed.state.find({i, name});
        if (it == resumed.state.end()) continue;
        const double es =
            relative_error(it->second, oracle.read(prefix + name + n + ".bin", traj.shapes[i]));
        worst.note(oc.c.component + " " + name, es);
        EXPECT_LE(es, kTolerance) << name << " of parameter " << n;
      }
    }
  }
  for (const auto& [kind, e] : worst.by_kind) {
    std::printf("[ measured ] %s: largest relative error %.3g\n", kind.c_str(), e);
  }
}

TEST(MuonSoapVsReference, HundredStepsOfEveryCase) { compare_with_references(at::kCPU); }

TEST(MuonSoapVsReference, HundredStepsOfEveryCaseCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  compare_with_references(at::Device(at::kCUDA, 0));
}

TEST(MuonSoapDescriptors, AreWellFormedAndNameTheirReference) {
  const std::vector<std::pair<std::string, std::string>> components = {{"kiln_muon", "muon"},
                                                                       {"kiln_soap", "soap"}};
  for (const auto& [library, name] : components) {
    SCOPED_TRACE(name);
    const Plugin& p = builtin(library);
    EXPECT_EQ(p.probe, KILN_ABI_PACK(KILN_ABI_MAJOR, KILN_ABI_MINOR));
    ASSERT_NE(p.descriptor->torch_version, nullptr);
    EXPECT_STREQ(p.descriptor->torch_version, KILN_TORCH_VERSION);
    const kiln_component_descriptor* c = p.component(name);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->kind, KILN_COMPONENT_OPTIMIZER);
    EXPECT_NE(std::string(c->summary)
                  .find(name == "muon" ? "torch.optim.Muon" : "pytorch_optimizer.SOAP"),
              std::string::npos)
        << c->summary;
    ASSERT_NE(c->capabilities, nullptr);
    EXPECT_EQ(c->capabilities->flags,
              KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA | KILN_CAP_DTYPE_F32 | KILN_CAP_DTYPE_F16 |
                  KILN_CAP_DTYPE_BF16 | KILN_CAP_DTYPE_F64 | KILN_CAP_MULTI_TENSOR);
    const auto* vt = static_cast<const kiln_optimizer_vtable*>(c->vtable);
    ASSERT_NE(vt, nullptr);
    EXPECT_EQ(vt->struct_size, sizeof(kiln_optimizer_vtable));
    EXPECT_TRUE(vt->create != nullptr && vt->destroy != nullptr && vt->step != nullptr);
    EXPECT_EQ(vt->eval_weights, nullptr);
    EXPECT_EQ(vt->step_all, nullptr);
    ASSERT_GT(c->option_count, 0u);
    for (size_t o = 0; o < c->option_count; ++o) {
      const kiln_option_spec& spec = c->options[o];
      SCOPED_TRACE(spec.name);
      EXPECT_EQ(spec.struct_size, sizeof(kiln_option_spec));
      EXPECT_NE(spec.default_value, nullptr);
      ASSERT_NE(spec.doc, nullptr);
      EXPECT_GT(std::string(spec.doc).size(), 10u);
      EXPECT_NE(std::string(spec.name), "lr");  // lr and weight decay come per call
      EXPECT_NE(std::string(spec.name), "weight_decay");
    }
    // The defaults are accepted, absent (the plugin's fallbacks) or filled in as the host does.
    Options none;
    Instance instance(*vt, none);
    EXPECT_EQ(instance.error(), "");
    Options filled;
    filled.set_string(name == "muon" ? "adjust_lr_fn" : "data_format",
                      name == "muon" ? "original" : "channels_first");
    filled.fill_defaults(*c);
    Instance with_defaults(*vt, filled);
    EXPECT_EQ(with_defaults.error(), "");
  }
}

TEST(MuonSoapOptions, InvalidValuesAreRefusedNamingTheOption) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Refusal {
    std::string component;
    std::function<void(Options&)> set;
    std::string named;
  };
  const std::vector<Refusal> refusals = {
      {"muon", [](Options& o) { o.set_float("momentum", 1.0); }, "momentum"},
      {"muon", [](Options& o) { o.set_float("momentum", -0.1); }, "momentum"},
      {"muon", [](Options& o) { o.set_float("eps", 0.0); }, "eps"},
      {"muon", [=](Options& o) { o.set_float("ns_a", nan); }, "ns_a"},
      {"muon", [](Options& o) { o.set_float("ns_c", HUGE_VAL); }, "ns_c"},
      {"muon", [](Options& o) { o.set_int("ns_steps", 100); }, "ns_steps"},
      {"muon", [](Options& o) { o.set_int("ns_steps", -1); }, "ns_steps"},
      {"muon", [](Options& o) { o.set_string("adjust_lr_fn", "linear"); }, "adjust_lr_fn"},
      {"soap", [](Options& o) { o.set_float("beta1", 1.0); }, "beta1"},
      {"soap", [](Options& o) { o.set_float("beta2", -0.1); }, "beta2"},
      {"soap", [](Options& o) { o.set_float("shampoo_beta", 1.0); }, "shampoo_beta"},
      {"soap", [](Options& o) { o.set_float("eps", -1e-8); }, "eps"},
      {"soap", [](Options& o) { o.set_int("precondition_frequency", 0); },
       "precondition_frequency"},
      {"soap", [](Options& o) { o.set_int("max_precondition_dim", 0); }, "max_precondition_dim"},
      {"soap", [](Options& o) { o.set_string("data_format", "nhwc"); }, "data_format"},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.component + " " + r.named);
    const kiln_optimizer_vtable& vt = optimizer_vtable("kiln_" + r.component, r.component);
    Options options;
    r.set(options);
    void* instance = nullptr;
    Status status = take(vt.create(fake_host(), options.get(), &instance));
    ASSERT_NE(status, nullptr);
    EXPECT_EQ(status->code, KILN_ERR_INVALID_ARGUMENT);
    EXPECT_NE(status->message.find(r.named), std::string::npos) << status->message;
    EXPECT_EQ(status->message.rfind(r.component + ":", 0), 0u) << status->message;
    EXPECT_EQ(instance, nullptr);
  }
}

// One step of `component` over `params` named `names`; the plugin's status ("" on success).
std::string step_once(const std::string& component, Options& options,
                      const std::vector<at::Tensor>& params, const std::vector<const char*>& names,
                      kiln_call_context& ctx) {
  const kiln_optimizer_vtable& vt = optimizer_vtable("kiln_" + component, component);
  Instance instance(vt, options);
  if (!instance.error().empty()) return "create: " + instance.error();
  std::vector<at::Tensor> grads;
  std::vector<DLTensor> p_dl, g_dl;
  for (const at::Tensor& p : params) {
    grads.push_back(at::randn(p.sizes()));
    p_dl.push_back(kiln::as_dltensor(p));
    g_dl.push_back(kiln::as_dltensor(grads.back()));
  }
  ctx.params = params;
  ctx.grads = grads;
  kiln_param_group group{};
  group.struct_size = sizeof(group);
  group.count = params.size();
  group.params = p_dl.data();
  group.grads = g_dl.data();
  group.names = names.data();
  group.step = 2;
  group.lr = 0.01;
  group.weight_decay = 0.01;
  Status status = take(vt.step(instance.get(), &ctx, &group));
  return describe(status.get());
}

TEST(MuonStep, ParametersThatAreNotMatricesAreRefusedByName) {
  const std::vector<std::pair<std::vector<int64_t>, std::string>> others = {
      {{13}, "[13]"}, {{8, 3, 3, 3}, "[8, 3, 3, 3]"}, {{}, "[]"}};
  for (const auto& [shape, text] : others) {
    SCOPED_TRACE(text);
    const std::vector<at::Tensor> params = {at::randn({4, 6}), at::randn(shape)};
    const std::vector<at::Tensor> before = {params[0].clone(), params[1].clone()};
    Options options;
    kiln_call_context ctx;
    const std::string status =
        step_once("muon", options, params, {"layer.weight", "layer.other"}, ctx);
    EXPECT_NE(status.find("code " + std::to_string(KILN_ERR_INVALID_ARGUMENT) + ": muon:"),
              std::string::npos)
        << status;
    EXPECT_NE(status.find("'layer.other'"), std::string::npos) << status;
    EXPECT_NE(status.find(text), std::string::npos) << status;
    EXPECT_NE(status.find("[[optimizer.partition]]"), std::string::npos) << status;
    EXPECT_EQ(status.find("layer.weight"), std::string::npos) << status;
    // Refused before anything changed.
    EXPECT_TRUE(ctx.state.empty());
    EXPECT_TRUE(params[0].equal(before[0]));
    EXPECT_TRUE(params[1].equal(before[1]));
  }
}

TEST(SoapStep, MergesTheReferenceCannotDoAreRefusedByName) {
  // 5x7 merges into [1] under the default max_precondition_dim.
  const std::vector<at::Tensor> params = {at::randn({50, 300}), at::randn({5, 7})};
  const std::vector<at::Tensor> before = {params[0].clone(), params[1].clone()};
  Options options;
  options.set_bool("merge_dims", true).set_int("max_precondition_dim", 100);
  kiln_call_context ctx;
  const std::string status =
      step_once("soap", options, params, {"big.weight", "small.weight"}, ctx);
  EXPECT_NE(status.find("code " + std::to_string(KILN_ERR_INVALID_ARGUMENT) + ": soap:"),
            std::string::npos)
      << status;
  EXPECT_NE(status.find("'small.weight'"), std::string::npos) << status;
  EXPECT_NE(status.find("[5, 7]"), std::string::npos) << status;
  EXPECT_NE(status.find("merge_dims"), std::string::npos) << status;
  EXPECT_TRUE(ctx.state.empty());
  EXPECT_TRUE(params[0].equal(before[0]));
  EXPECT_TRUE(params[1].equal(before[1]));
}

// One GG and one Q per basis, "GG.<k>" and "Q.<k>" for the reference's state["GG"][k] and
// state["Q"][k]: contiguous d_k x d_k in the parameter's dtype, Q orthogonal (kept transposed),
// and none for a dimension without a basis.
TEST(SoapStep, StateHoldsOneGgAndQPerBasisOfItsSize) {
  struct Setup {
    std::string name;
    std::function<void(Options&)> set;
    // Per parameter: each dimension's basis size, 0 for the identity.
    std::vector<std::vector<int64_t>> bases;
  };
  const std::vector<Setup> setups = {
      // A vector keeps no basis; every dimension of the others does.
      {"default", [](Options&) {}, {{40, 1000}, {}, {6, 5}, {3, 4, 5}}},
      // 1000 is above max_precondition_dim (no GG.1 or Q.1); the vector gets a basis.
      {"precondition_1d",
       [](Options& o) { o.set_bool("precondition_1d", true).set_int("max_precondition_dim", 100); },
       {{40, 0}, {13}, {6, 5}, {3, 4, 5}}},
      // Bases of the merged shapes: 40x1000 -> [1, 40, 1000], 13 -> [1, 13] (a vector: none),
      // 6x5 stays, 3x4x5 -> [12, 5].
      {"merge_dims",
       [](Options& o) { o.set_bool("merge_dims", true).set_int("max_precondition_dim", 12); },
       {{1, 0, 0}, {}, {6, 5}, {12, 5}}},
  };
  for (const Setup& setup : setups) {
    SCOPED_TRACE(setup.name);
    const std::vector<at::Tensor> params = {at::randn({40, 1000}), at::randn({13}),
                                            at::randn({6, 5}), at::randn({3, 4, 5})};
    Options options;
    setup.set(options);
    kiln_call_context ctx;
    ASSERT_EQ(step_once("soap", options, params, {"a", "b", "c", "d"}, ctx), "");
    for (size_t i = 0; i < params.size(); ++i) {
      SCOPED_TRACE(i);
      std::set<std::string> want = {"exp_avg", "exp_avg_sq"};
      const std::vector<int64_t>& bases = setup.bases[i];
      for (size_t k = 0; k < bases.size(); ++k) {
        if (bases[k] == 0) continue;
        want.insert("GG." + std::to_string(k));
        want.insert("Q." + std::to_string(k));
      }
      std::set<std::string> names;
      for (const auto& [key, value] : ctx.state) {
        if (key.first == i) names.insert(key.second);
      }
      EXPECT_EQ(names, want);
      for (size_t k = 0; k < bases.size(); ++k) {
        const int64_t d = bases[k];
        if (d == 0) continue;
        for (const std::string prefix : {"GG.", "Q."}) {
          const auto it = ctx.state.find({i, prefix + std::to_string(k)});
          ASSERT_NE(it, ctx.state.end()) << prefix << k;
          const at::Tensor& t = it->second;
          EXPECT_EQ(t.sizes(), at::IntArrayRef({d, d})) << prefix << k;
          EXPECT_TRUE(t.is_contiguous()) << prefix << k;
          EXPECT_EQ(t.scalar_type(), params[i].scalar_type()) << prefix << k;
          if (prefix == "Q.") {
            EXPECT_TRUE(at::allclose(t.t().mm(t), at::eye(d), 0.0, 1e-4)) << prefix << k;
          } else {
            EXPECT_TRUE(at::allclose(t, t.t())) << prefix << k;  // sums of g g^T: symmetric
            EXPECT_GT(t.abs().max().item<double>(), 0.0) << prefix << k;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln::test
