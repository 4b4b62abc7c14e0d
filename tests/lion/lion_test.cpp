// The lion plugin (plain C) as the engine runs it: loaded by the host's Loader, stepped through
// OptimizerAdapter with its state in the host's StateStore, checked against lion-pytorch's update
// in torch over 100 steps, on contiguous, strided and byte-offset views; and its refusals.
#include <ATen/Functions.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "config/options.hpp"
#include "kiln/torch.hpp"
#include "kiln_test_paths.h"
#include "plugin/adapters.hpp"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/status.hpp"

namespace {

using kiln::config::OptionSet;
using kiln::plugin::Component;
using kiln::plugin::ComponentError;
using kiln::plugin::OptimizerAdapter;

const std::string kLibrary = std::string(KILN_PLUGIN_DIR) + "/libkiln_lion.so";

// The "lion" component, loaded once through the host's loader (libraries stay loaded).
const Component& lion() {
  static kiln::plugin::Registry registry;
  static const Component* component = [] {
    kiln::plugin::LibraryLoader(kiln::plugin::host_api()).load_library(kLibrary, registry);
    return registry.find(KILN_COMPONENT_OPTIMIZER, "lion");
  }();
  if (component == nullptr) throw std::runtime_error("no optimizer 'lion' in " + kLibrary);
  return *component;
}

OptionSet lion_options(double beta1, double beta2) {
  OptionSet set;
  for (const auto& [name, v] : {std::pair<const char*, double>{"beta1", beta1}, {"beta2", beta2}}) {
    kiln::config::Value value;
    value.type = KILN_OPT_FLOAT;
    value.float_value = v;
    set.set(name, value);
  }
  return set;
}

const kiln_optimizer_vtable& lion_vtable() {
  return *static_cast<const kiln_optimizer_vtable*>(lion().descriptor->vtable);
}

// A scratch directory for the oracle (POSIX calls: libtorch exports a broken std::filesystem).
class Scratch {
 public:
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/kiln_lion_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
  }
  ~Scratch() {
    for (const auto& name : written_) unlink((dir_ + "/" + name).c_str());
    rmdir(dir_.c_str());
  }
  void write(const std::string& name, const at::Tensor& t) {
    at::Tensor c = t.contiguous();
    std::ofstream(path(name), std::ios::binary)
        .write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  }
  void write_text(const std::string& name, const std::string& text) {
    std::ofstream(path(name)) << text;
  }
  at::Tensor read(const std::string& name, at::IntArrayRef shape) {
    at::Tensor t = at::empty(shape, at::kFloat);
    std::ifstream in(path(name), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes.size() != t.nbytes()) throw std::runtime_error("oracle wrote a bad " + name);
    std::copy(bytes.begin(), bytes.end(), static_cast<char*>(t.data_ptr()));
    return t;
  }
  void run(const std::string& script) {
    const std::string command = std::string("\"") + KILN_TEST_PYTHON + "\" \"" + KILN_SOURCE_DIR +
                                "/tests/lion/" + script + "\" \"" + dir_ + "\"";
    if (std::system(command.c_str()) != 0) throw std::runtime_error("oracle failed: " + command);
  }

 private:
  std::string path(const std::string& name) {
    written_.push_back(name);
    return dir_ + "/" + name;
  }
  std::string dir_;
  std::vector<std::string> written_;
};

// 100 steps of one group: initial parameters, per-step gradients and rates, and torch's answer.
struct Problem {
  int steps = 100;
  double beta1 = 0.9, beta2 = 0.99, weight_decay = 0.1;
  std::vector<std::vector<int64_t>> shapes = {{7, 5}, {13}, {3, 4, 5, 2}, {1, 6}, {}};
  std::vector<std::string> names;
  std::vector<at::Tensor> initial, grads;  // grads: [steps] + shape
  std::vector<double> lrs;
  std::vector<at::Tensor> want_p, want_m;
};

Problem make_problem(double beta1, double beta2) {
  Problem pr;
  pr.beta1 = beta1;
  pr.beta2 = beta2;
  at::manual_seed(11);
  for (size_t i = 0; i < pr.shapes.size(); ++i) {
    const auto& shape = pr.shapes[i];
    std::vector<int64_t> gshape{pr.steps};
    gshape.insert(gshape.end(), shape.begin(), shape.end());
    pr.names.push_back("layer" + std::to_string(i) + ".weight");
    pr.initial.push_back(at::randn(shape, at::kFloat));
    at::Tensor g = at::randn(gshape, at::kFloat);
    // Zero gradients at step 1 make c exactly 0 there: sign(0) = 0 must leave only the decay.
    if (i == 0) g[0].slice(1, 0, 2).zero_();
    pr.grads.push_back(g);
  }
  for (int s = 0; s < pr.steps; ++s) pr.lrs.push_back(1e-3 * (1.0 + 0.5 * std::sin(0.3 * s)));

  Scratch scratch;
  std::ostringstream cfg;
  cfg.precision(17);
  cfg << "{\"steps\": " << pr.steps << ", \"beta1\": " << beta1 << ", \"beta2\": " << beta2
      << ", \"weight_decay\": " << pr.weight_decay << ", \"lrs\": [";
  for (size_t s = 0; s < pr.lrs.size(); ++s) cfg << (s ? ", " : "") << pr.lrs[s];
  cfg << "], \"shapes\": [";
  for (size_t i = 0; i < pr.shapes.size(); ++i) {
    cfg << (i ? ", [" : "[");
    for (size_t d = 0; d < pr.shapes[i].size(); ++d) cfg << (d ? ", " : "") << pr.shapes[i][d];
    cfg << "]";
    scratch.write("p" + std::to_string(i) + ".bin", pr.initial[i]);
    scratch.write("g" + std::to_string(i) + ".bin", pr.grads[i]);
  }
  cfg << "]}";
  scratch.write_text("config.json", cfg.str());
  scratch.run("lion_oracle.py");
  for (size_t i = 0; i < pr.shapes.size(); ++i) {
    pr.want_p.push_back(scratch.read("p" + std::to_string(i) + "_out.bin", pr.shapes[i]));
    pr.want_m.push_back(scratch.read("m" + std::to_string(i) + "_out.bin", pr.shapes[i]));
  }
  return pr;
}

// Max |a - e| / (atol + rtol * |e|): <= 1 means close.
double closeness(const at::Tensor& actual, const at::Tensor& expected) {
  at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  return ((a - e).abs() / (e.abs() * 1e-6 + 1e-7)).max().item<double>();
}

// A non-compact view of a fresh buffer with `shape`: the last dimension every other element
// from offset 1, and the dimension order reversed in memory (a transpose). Filling the rest of
// the buffer with a sentinel shows the update stays inside the view.
struct StridedParam {
  at::Tensor base, view;
};
StridedParam strided_param(const std::vector<int64_t>& shape) {
  if (shape.empty()) {
    at::Tensor base = at::full({2}, 7.0f);
    return {base, base.select(0, 1)};
  }
  std::vector<int64_t> reversed(shape.rbegin(), shape.rend());
  reversed[0] = 2 * reversed[0];
  at::Tensor base = at::full(reversed, 7.0f);
  at::Tensor view = base.slice(0, 1, reversed[0], 2);
  std::vector<int64_t> order;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) order.push_back(d);
  return {base, view.permute(order)};
}

// Gradients [steps] + shape stored every other float (NaN between), so they are strided too.
at::Tensor strided_grads(const at::Tensor& grads) {
  std::vector<int64_t> shape(grads.sizes().begin(), grads.sizes().end());
  shape.push_back(2);
  at::Tensor store = at::full(shape, std::numeric_limits<float>::quiet_NaN());
  at::Tensor values = store.select(-1, 0);
  values.copy_(grads);
  return values;
}

enum class Layout { kContiguous, kStrided, kByteOffset };
const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kContiguous:
      return "Contiguous";
    case Layout::kStrided:
      return "Strided";
    default:
      return "ByteOffset";
  }
}
void PrintTo(Layout layout, std::ostream* os) { *os << layout_name(layout); }

struct Result {
  std::vector<at::Tensor> p, m;
};

// Runs the problem through the adapter (contiguous or strided at::Tensor parameters), or for
// kByteOffset by calling the vtable with hand-made views: data at the start of the allocation
// plus a byte_offset, and compact gradients with NULL strides.
Result run(const Problem& pr, Layout layout) {
  const size_t n = pr.shapes.size();
  std::vector<at::Tensor> params, bases, base_before;
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < n; ++i) {
    if (layout == Layout::kContiguous) {
      params.push_back(pr.initial[i].clone());
      grads.push_back(pr.grads[i]);
    } else {
      StridedParam sp = strided_param(pr.shapes[i]);
      sp.view.copy_(pr.initial[i]);
      EXPECT_FALSE(sp.view.is_contiguous() && !pr.shapes[i].empty()) << i;
      bases.push_back(sp.base);
      base_before.push_back(sp.base.clone());
      params.push_back(sp.view);
      grads.push_back(layout == Layout::kStrided ? strided_grads(pr.grads[i]) : pr.grads[i]);
    }
  }

  kiln::plugin::StateStore direct_state;
  OptimizerAdapter adapter(lion(), lion_options(pr.beta1, pr.beta2));
  void* instance = nullptr;
  const OptionSet options = lion_options(pr.beta1, pr.beta2);
  if (layout == Layout::kByteOffset) {
    kiln::plugin::check(lion_vtable().create(kiln::plugin::host_api(), options.c_view(), &instance),
                        "lion create");
  }
  for (int s = 0; s < pr.steps; ++s) {
    if (layout != Layout::kByteOffset) {
      for (size_t i = 0; i < n; ++i) params[i].mutable_grad() = grads[i][s];
      kiln::plugin::GroupStep group;
      group.params = &params;
      group.names = &pr.names;
      group.step = s + 1;
      group.lr = pr.lrs[s];
      group.weight_decay = pr.weight_decay;
      adapter.step(group);
      continue;
    }
    std::vector<DLTensor> pv(n), gv(n);
    std::vector<const char*> names(n);
    for (size_t i = 0; i < n; ++i) {
      pv[i] = kiln::as_dltensor(params[i]);
      pv[i].data = bases[i].data_ptr();
      pv[i].byte_offset = static_cast<uint64_t>(params[i].storage_offset()) * sizeof(float);
      gv[i] = kiln::as_dltensor(params[i]);
      gv[i].data = grads[i].data_ptr();
      gv[i].byte_offset = static_cast<uint64_t>(s * params[i].numel()) * sizeof(float);
      gv[i].strides = nullptr;
      names[i] = pr.names[i].c_str();
    }
    kiln_param_group group{};
    group.struct_size = sizeof group;
    group.count = n;
    group.params = pv.data();
    group.grads = gv.data();
    group.names = names.data();
    group.step = s + 1;
    group.lr = pr.lrs[s];
    group.weight_decay = pr.weight_decay;
    std::vector<kiln::plugin::ParamState*> slots;
    for (const std::string& name : pr.names) slots.push_back(&direct_state[name]);
    kiln_call_context ctx;
    ctx.params = &params;
    ctx.state = &slots;
    kiln::plugin::check(lion_vtable().step(instance, &ctx, &group), "lion step");
  }
  if (instance != nullptr) lion_vtable().destroy(instance);

  const kiln::plugin::StateStore& state =
      layout == Layout::kByteOffset ? direct_state : adapter.state();
  Result result;
  for (size_t i = 0; i < n; ++i) {
    result.p.push_back(params[i].contiguous());
    result.m.push_back(state.at(pr.names[i]).at("exp_avg"));
    if (!bases.empty()) {
      // Outside the view the buffer is exactly as it was.
      at::Tensor expected_base = base_before[i];
      StridedParam again = strided_param(pr.shapes[i]);
      again.base.copy_(expected_base);
      again.view.copy_(params[i]);
      EXPECT_TRUE(at::equal(again.base, bases[i]))
          << "parameter " << i << " wrote outside its view";
    }
  }
  return result;
}

class LionVsTorch : public ::testing::TestWithParam<Layout> {
 protected:
  static void SetUpTestSuite() {
    defaults_ = new Problem(make_problem(0.9, 0.99));
    custom_ = new Problem(make_problem(0.8, 0.95));
  }
  static void TearDownTestSuite() {
    delete defaults_;
    delete custom_;
  }
  static void check(const Problem& pr, Layout layout) {
    Result r = run(pr, layout);
    for (size_t i = 0; i < pr.shapes.size(); ++i) {
      EXPECT_LE(closeness(r.p[i], pr.want_p[i]), 1.0) << "param " << i;
      EXPECT_LE(closeness(r.m[i], pr.want_m[i]), 1.0) << "exp_avg " << i;
      // The run moved the parameters (a broken step that did nothing would fail above too, but
      // this names the failure).
      EXPECT_FALSE(at::equal(r.p[i], pr.initial[i])) << "param " << i << " never changed";
    }
  }
  static Problem* defaults_;
  static Problem* custom_;
};
Problem* LionVsTorch::defaults_ = nullptr;
Problem* LionVsTorch::custom_ = nullptr;

TEST_P(LionVsTorch, HundredStepsDefaultBetas) { check(*defaults_, GetParam()); }
TEST_P(LionVsTorch, HundredStepsOtherBetas) { check(*custom_, GetParam()); }

INSTANTIATE_TEST_SUITE_P(Layouts, LionVsTorch,
                         ::testing::Values(Layout::kContiguous, Layout::kStrided,
                                           Layout::kByteOffset),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return std::string(layout_name(info.param));
                         });

// ---- refusals --------------------------------------------------------------------------------

// The ComponentError a one-step adapter run of `params` (with gradients `grads`) throws.
std::string refusal(std::vector<at::Tensor> params, const std::vector<at::Tensor>& grads,
                    OptimizerAdapter& adapter, int32_t* code) {
  std::vector<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].mutable_grad() = grads[i];
    names.push_back("w" + std::to_string(i));
  }
  kiln::plugin::GroupStep group;
  group.params = &params;
  group.names = &names;
  group.step = 1;
  group.lr = 0.1;
  try {
    adapter.step(group);
  } catch (const ComponentError& e) {
    *code = e.code();
    return e.what();
  }
  return "";
}

TEST(LionRefuses, AFloat64ParameterAndLeavesTheGroupUntouched) {
  OptimizerAdapter adapter(lion(), lion_options(0.9, 0.99));
  at::Tensor w0 = at::ones({3}), w1 = at::ones({2}, at::kDouble);
  int32_t code = 0;
  EXPECT_EQ(refusal({w0, w1}, {at::ones({3}), at::ones({2}, at::kDouble)}, adapter, &code),
            "optimizer 'lion' step: lion: parameter 'w1' (index 1) is float64 on cpu; lion "
            "supports float32 CPU tensors only");
  EXPECT_EQ(code, KILN_ERR_UNSUPPORTED);
  // Checked before anything is written: w0 not updated, no state created.
  EXPECT_TRUE(at::equal(w0, at::ones({3})));
  for (const auto& [param, states] : adapter.state()) EXPECT_TRUE(states.empty()) << param;
}

TEST(LionRefuses, AHalfGradientAndABfloat16Parameter) {
  OptimizerAdapter adapter(lion(), lion_options(0.9, 0.99));
  int32_t code = 0;
  EXPECT_EQ(refusal({at::ones({4})}, {at::ones({4}, at::kHalf)}, adapter, &code),
            "optimizer 'lion' step: lion: gradient of parameter 'w0' (index 0) is float16 on "
            "cpu; lion supports float32 CPU tensors only");
  EXPECT_EQ(code, KILN_ERR_UNSUPPORTED);
  code = 0;
  EXPECT_EQ(refusal({at::ones({4}, at::kBFloat16)}, {at::ones({4}, at::kBFloat16)}, adapter, &code),
            "optimizer 'lion' step: lion: parameter 'w0' (index 0) is bfloat16 on cpu; lion "
            "supports float32 CPU tensors only");
  EXPECT_EQ(code, KILN_ERR_UNSUPPORTED);
}

TEST(LionRefuses, ACudaTensorHandedToItDirectly) {
  // No GPU needed: the plugin must refuse from the view's device field before touching data.
  const OptionSet options = lion_options(0.9, 0.99);
  void* instance = nullptr;
  kiln::plugin::check(lion_vtable().create(kiln::plugin::host_api(), options.c_view(), &instance),
                      "create");
  at::Tensor cpu = at::ones({5});
  DLTensor p = kiln::as_dltensor(cpu);
  p.device.device_type = kDLCUDA;
  p.data = nullptr;
  DLTensor g = p;
  const char* name = "fc.weight";
  kiln_param_group group{};
  group.struct_size = sizeof group;
  group.count = 1;
  group.params = &p;
  group.grads = &g;
  group.names = &name;
  group.step = 1;
  group.lr = 0.1;
  kiln::plugin::StateStore state;
  std::vector<at::Tensor> params{cpu};
  std::vector<kiln::plugin::ParamState*> slots{&state[name]};
  kiln_call_context ctx;
  ctx.params = &params;
  ctx.state = &slots;
  kiln_status* status = lion_vtable().step(instance, &ctx, &group);
  ASSERT_NE(status, nullptr);
  EXPECT_EQ(status->code, KILN_ERR_UNSUPPORTED);
  EXPECT_EQ(kiln::plugin::take_message(status),
            "lion: parameter 'fc.weight' (index 0) is float32 on cuda:0; lion supports float32 "
            "CPU tensors only");
  EXPECT_TRUE(state.at(name).empty());
  lion_vtable().destroy(instance);
}

TEST(LionRefuses, BetasOutsideZeroToOne) {
  const OptionSet options = lion_options(1.5, 0.99);
  void* instance = nullptr;
  kiln_status* status = lion_vtable().create(kiln::plugin::host_api(), options.c_view(), &instance);
  ASSERT_NE(status, nullptr);
  EXPECT_EQ(status->code, KILN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln::plugin::take_message(status),
            "lion: beta1 and beta2 must be in [0, 1], got 1.5 and 0.99");
}

// ---- what it declares --------------------------------------------------------------------------

TEST(LionDeclares, CpuAndFloat32OnlySoTheHostRefusesItOnCuda) {
  const Component& c = lion();
  EXPECT_EQ(c.descriptor->capabilities->flags, KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32);
  EXPECT_EQ(kiln::plugin::capability_problem(c, c10::DeviceType::CPU, at::kFloat), "");
  EXPECT_EQ(kiln::plugin::capability_problem(c, c10::DeviceType::CUDA, at::kFloat),
            "optimizer 'lion' supports devices: cpu; the pipeline runs on cuda");
  EXPECT_EQ(kiln::plugin::capability_problem(c, c10::DeviceType::CPU, at::kBFloat16),
            "optimizer 'lion' does not support dtype BFloat16 which the pipeline's precision "
            "uses");
}

TEST(LionDeclares, Beta1AndBeta2WithLionPytorchDefaults) {
  const kiln_component_descriptor* d = lion().descriptor;
  ASSERT_EQ(d->option_count, 2u);
  EXPECT_STREQ(d->options[0].name, "beta1");
  EXPECT_STREQ(d->options[0].default_value, "0.9");
  EXPECT_STREQ(d->options[1].name, "beta2");
  EXPECT_STREQ(d->options[1].default_value, "0.99");
  EXPECT_EQ(lion().plugin->torch_version, nullptr);
  EXPECT_EQ(lion().plugin->torch_cxx11_abi, -1);
}

TEST(LionDeclares, NoDependencyOnLibTorchOrTheCxxRuntime) {
  // The dynamic string table names every DT_NEEDED library; none may be torch's or libstdc++.
  std::ifstream in(kLibrary, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(bytes.empty());
  for (const char* lib : {"libtorch", "libc10", "libstdc++"}) {
    EXPECT_EQ(bytes.find(lib), std::string::npos) << kLibrary << " refers to " << lib;
  }
}

}  // namespace
