// An exception of any type that a C++ plugin lets out of an entry (tests/plugins/throwing.cpp)
// is caught at the adapter: a ComponentError naming the entry, the library and the exception,
// or (init) a refusal of the library; a throwing `destroy` is logged, never fatal.
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <string>

#include "kiln/torch.hpp"
#include "kiln_test_paths.h"
#include "plugin/adapters.hpp"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/norm_layer.hpp"
#include "plugin/status.hpp"

namespace {

using kiln::config::OptionSet;
using kiln::config::Value;
using kiln::plugin::ComponentError;

const std::string kLibrary = std::string(KILN_TEST_PLUGIN_DIR) + "/throwing/libthrowing.so";

const kiln::plugin::Registry& registry() {
  static kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
  static kiln::plugin::Registry r = [] {
    kiln::plugin::Registry out;
    loader.load_library(kLibrary, out);
    return out;
  }();
  return r;
}

const kiln::plugin::Component& component(int32_t kind, const char* name) {
  const kiln::plugin::Component* c = registry().find(kind, name);
  EXPECT_NE(c, nullptr) << name;
  return *c;
}

OptionSet throwing_at(const std::string& entry, const std::string& what = "int") {
  OptionSet o;
  Value at;
  at.type = KILN_OPT_STRING;
  at.string_value = entry;
  o.set("throw_at", at);
  Value kind = at;
  kind.string_value = what;
  o.set("throw_what", kind);
  return o;
}

// Runs `body`, which must throw a ComponentError whose text has every one of `parts`.
template <typename Body>
void expect_component_error(Body&& body, std::initializer_list<std::string> parts) {
  try {
    body();
    ADD_FAILURE() << "no exception";
  } catch (const ComponentError& e) {
    const std::string what = e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
    }
  }
}

TEST(EscapedException, InitThatThrowsRefusesTheLibraryOnly) {
  kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
  std::vector<std::string> refused;
  kiln::plugin::Registry r =
      kiln::plugin::load_all(loader,
                             {std::string(KILN_TEST_PLUGIN_DIR) + "/throwing_init",
                              std::string(KILN_TEST_PLUGIN_DIR) + "/good"},
                             refused);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("throwing_init/libthrowing_init.so: init threw int"), std::string::npos)
      << refused[0];
  EXPECT_NE(r.find_any("c_sgd"), nullptr);  // the next folder still loads
  EXPECT_EQ(r.find_any("init_throws_opt"), nullptr);
}

TEST(EscapedException, OptimizerCreateStepAndDestroy) {
  const auto& opt = component(KILN_COMPONENT_OPTIMIZER, "throwing_opt");
  expect_component_error([&] { kiln::plugin::OptimizerAdapter a(opt, throwing_at("create")); },
                         {"optimizer 'throwing_opt' create", kLibrary, "threw int"});
  expect_component_error(
      [&] { kiln::plugin::OptimizerAdapter a(opt, throwing_at("create", "std")); },
      {"threw std::runtime_error: thrown from create"});

  kiln::plugin::OptimizerAdapter stepper(opt, throwing_at("step"));
  at::Tensor p = at::ones({3});
  p.mutable_grad() = at::ones({3});
  std::vector<at::Tensor> params = {p};
  std::vector<std::string> names = {"w"};
  kiln::plugin::GroupStep group;
  group.params = &params;
  group.names = &names;
  group.step = 1;
  group.lr = 0.1;
  expect_component_error([&] { stepper.step(group); },
                         {"optimizer 'throwing_opt' step", kLibrary, "threw int"});

  // Destroy throws from the destructor: logged, the process goes on.
  { kiln::plugin::OptimizerAdapter destroyed(opt, throwing_at("destroy")); }
  SUCCEED();
}

TEST(EscapedException, LrPolicyCreateLrAtAndDestroy) {
  const auto& policy = component(KILN_COMPONENT_LR_POLICY, "throwing_lr");
  kiln_lr_schedule schedule{};
  schedule.struct_size = sizeof(schedule);
  schedule.base_lr = 0.1;
  schedule.max_iters = 10;
  schedule.iters_per_epoch = 10;
  expect_component_error(
      [&] { kiln::plugin::LrPolicyAdapter a(policy, throwing_at("create"), schedule); },
      {"lr_policy 'throwing_lr' create", "threw int"});
  kiln::plugin::LrPolicyAdapter at(policy, throwing_at("lr_at", "std"), schedule);
  expect_component_error([&] { (void)at.lr_at(1); },
                         {"lr_policy 'throwing_lr' lr_at", "thrown from lr_at"});
  { kiln::plugin::LrPolicyAdapter destroyed(policy, throwing_at("destroy"), schedule); }
  kiln::plugin::LrPolicyAdapter fine(policy, throwing_at("none"), schedule);
  EXPECT_DOUBLE_EQ(fine.lr_at(3), 0.1);
}

TEST(EscapedException, PrecisionCreateAndPolicy) {
  const auto& precision = component(KILN_COMPONENT_PRECISION, "throwing_precision");
  expect_component_error(
      [&] { kiln::plugin::PrecisionAdapter a(precision, throwing_at("create"), c10::kCPU); },
      {"precision 'throwing_precision' create", "threw int"});
  expect_component_error(
      [&] { kiln::plugin::PrecisionAdapter a(precision, throwing_at("policy"), c10::kCPU); },
      {"precision 'throwing_precision' policy", "threw int"});
}

TEST(EscapedException, NormForwardBackwardInsideAutograd) {
  const auto& norm = component(KILN_COMPONENT_NORM, "throwing_norm");
  kiln_norm_request request{};
  request.struct_size = sizeof(request);
  request.num_features = 2;
  expect_component_error(
      [&] { kiln::plugin::PluginNormLayer layer(norm, throwing_at("create"), request); },
      {"norm 'throwing_norm' create", "threw int"});

  at::Tensor x = at::randn({4, 2, 3, 3}).requires_grad_(true);
  auto forward_throws =
      std::make_shared<kiln::plugin::PluginNormLayer>(norm, throwing_at("forward"), request);
  expect_component_error([&] { (void)forward_throws->forward(x); },
                         {"norm 'throwing_norm' forward", kLibrary, "threw int"});

  // Backward runs in autograd's engine; the error comes back to the caller of backward().
  auto backward_throws =
      std::make_shared<kiln::plugin::PluginNormLayer>(norm, throwing_at("backward"), request);
  at::Tensor y = backward_throws->forward(x);
  try {
    y.sum().backward();
    ADD_FAILURE() << "backward did not throw";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("norm 'throwing_norm' backward"), std::string::npos) << what;
    EXPECT_NE(what.find("threw int"), std::string::npos) << what;
  }
  { kiln::plugin::PluginNormLayer destroyed(norm, throwing_at("destroy"), request); }
}

TEST(EscapedException, ModelCreate) {
  const auto& model = component(KILN_COMPONENT_MODEL, "throwing_model");
  OptionSet o;
  Value what;
  what.type = KILN_OPT_STRING;
  what.string_value = "int";
  o.set("throw_what", what);
  kiln_model_input input{};
  input.struct_size = sizeof(input);
  expect_component_error([&] { (void)kiln::plugin::create_model(model, o, input); },
                         {"model 'throwing_model' create", kLibrary, "threw int"});
}

}  // namespace
