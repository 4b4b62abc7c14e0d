// The ABI 1.6 contract at the loader: every library's LibTorch build is checked whatever its
// kinds, reserved fields must be zero, a plain-C plugin written with the SDK's initialiser macros
// loads and works, and plugins built against the frozen 1.5 headers still load.
#include <gtest/gtest.h>
#include <torch/version.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/lr_policy.h"
#include "kiln/plugin.h"
#include "kiln_test_paths.h"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/status.hpp"

using kiln::plugin::LibraryLoader;
using kiln::plugin::LoadError;
using kiln::plugin::Registry;

namespace {

#ifdef _GLIBCXX_USE_CXX11_ABI
constexpr int kCxx11Abi = _GLIBCXX_USE_CXX11_ABI;
#else
constexpr int kCxx11Abi = 0;
#endif

std::string test_plugin(const std::string& name) {
  return std::string(KILN_TEST_PLUGIN_DIR) + "/lib" + name + ".so";
}

// The message a load of `path` fails with ("" when it loads into `registry`).
std::string refusal(const std::string& path, Registry& registry) {
  try {
    LibraryLoader(kiln::plugin::host_api()).load_library(path, registry);
  } catch (const LoadError& e) {
    EXPECT_EQ(e.path(), path);
    return e.what();
  }
  return "";
}
std::string refusal(const std::string& path) {
  Registry registry;
  return refusal(path, registry);
}

TEST(AbiContract, RefusesAnOptimizerBuiltAgainstAnotherTorch) {
  const std::string path = test_plugin("bad_torch_optimizer");
  EXPECT_EQ(refusal(path), path +
                               ": built against LibTorch 1.13.0 (C++11 ABI 0), this host uses "
                               "LibTorch " TORCH_VERSION " (C++11 ABI " +
                               std::to_string(kCxx11Abi) + ")");
}

TEST(AbiContract, RefusesALibraryThatLinksTorchButRecordsNone) {
  const std::string path = test_plugin("bad_torch_unrecorded");
  const std::string why = refusal(path);
  EXPECT_EQ(why.rfind(path + ": links lib", 0), 0u) << why;
  EXPECT_NE(why.find(" but records no LibTorch (torch_version is NULL); since ABI 1.6"),
            std::string::npos)
      << why;
}

TEST(AbiContract, RefusesANonZeroReservedFieldNamingTheStruct) {
  const std::string plugin = test_plugin("bad_nonzero_reserved_plugin");
  EXPECT_EQ(refusal(plugin), plugin + ": plugin descriptor field 'reserved' is 7, not zero");
  const std::string component = test_plugin("bad_nonzero_reserved_component");
  EXPECT_EQ(refusal(component), component +
                                    ": component 'reserved_opt' (optimizer) descriptor field "
                                    "'reserved' is 7, not zero");
  const std::string option = test_plugin("bad_nonzero_reserved_option");
  EXPECT_EQ(refusal(option), option +
                                 ": component 'reserved_opt' (optimizer) option 'beta' field "
                                 "'reserved' is 7, not zero");
}

// Every built-in library loads, and each records the LibTorch it runs exactly when it links it.
TEST(AbiContract, BuiltInLibrariesRecordTheirTorch) {
  Registry registry;
  std::vector<std::string> refused;
  LibraryLoader(kiln::plugin::host_api()).load_directory(KILN_PLUGIN_DIR, registry, refused);
  EXPECT_TRUE(refused.empty()) << refused.front();
  // Without LibTorch: the plain-C ones and the datasets (C++ with no torch).
  const std::vector<std::string> plain_c = {"kiln-lion", "kiln-lr-schedules", "kiln-fp32",
                                            "kiln-amp",  "kiln-datasets",     "kiln-image-folder"};
  std::vector<std::string> libraries;
  for (const kiln::plugin::Component& c : registry.all()) {
    const std::string library = c.plugin->name;
    if (std::find(libraries.begin(), libraries.end(), library) != libraries.end()) continue;
    libraries.push_back(library);
    SCOPED_TRACE(library);
    EXPECT_EQ(c.plugin->reserved, 0);
    if (std::find(plain_c.begin(), plain_c.end(), library) != plain_c.end()) {
      EXPECT_EQ(c.plugin->torch_version, nullptr);
      EXPECT_EQ(c.plugin->torch_cxx11_abi, -1);
    } else {
      ASSERT_NE(c.plugin->torch_version, nullptr);
      EXPECT_STREQ(c.plugin->torch_version, TORCH_VERSION);
      EXPECT_EQ(c.plugin->torch_cxx11_abi, kCxx11Abi);
    }
  }
  // sgd, rmsprop, adam, lamb, lion, adam-family, adaptive, classic, muon, soap, schedulefree,
  // sam, lookahead, lbfgs, lr-schedules, fp32, amp, batchnorm, syncbn, frozen-bn, inplace-abn,
  // mlp, resnet, vit, torchscript, datasets, image-folder
  EXPECT_EQ(libraries.size(), 27u);
}

// good_c_macros.c fills every struct with the initialiser macros: sizes, counts, bounds,
// choices, attributes and versions come out as the positional lists used to spell them.
TEST(AbiContract, APluginWrittenWithTheMacrosLoadsAndWorks) {
  Registry registry;
  const std::string path = std::string(KILN_TEST_PLUGIN_DIR) + "/good/libgood_c_macros.so";
  ASSERT_EQ(refusal(path, registry), "");
  const kiln::plugin::Component* c = registry.find(KILN_COMPONENT_LR_POLICY, "c_linear");
  ASSERT_NE(c, nullptr);
  const kiln_plugin_descriptor& d = *c->plugin;
  EXPECT_EQ(d.struct_size, sizeof(kiln_plugin_descriptor));
  EXPECT_EQ(d.abi_major, static_cast<uint32_t>(KILN_ABI_MAJOR));
  EXPECT_EQ(d.abi_minor, static_cast<uint32_t>(KILN_ABI_MINOR));
  EXPECT_STREQ(d.name, "good-c-macros");
  EXPECT_EQ(d.component_count, 1u);
  EXPECT_EQ(d.init, nullptr);
  EXPECT_EQ(d.torch_version, nullptr);
  EXPECT_EQ(d.torch_cxx11_abi, -1);
  const kiln_component_descriptor& cd = *c->descriptor;
  EXPECT_EQ(cd.struct_size, sizeof(kiln_component_descriptor));
  EXPECT_EQ(cd.reserved, 0);
  EXPECT_EQ(cd.version.major, 1u);
  EXPECT_EQ(cd.version.minor, 2u);
  EXPECT_EQ(cd.version.patch, 3u);
  ASSERT_NE(cd.capabilities, nullptr);
  EXPECT_EQ(cd.capabilities->struct_size, sizeof(kiln_capabilities));
  EXPECT_EQ(cd.capabilities->flags, KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA);
  ASSERT_EQ(cd.capabilities->attribute_count, 1u);
  EXPECT_STREQ(cd.capabilities->attributes[0].value, "initialiser macros");
  ASSERT_EQ(cd.option_count, 4u);
  struct Want {
    const char* name;
    int32_t type, has_min, has_max;
    double min, max;
    const char* default_value;
    const char* choices;
  };
  const Want want[] = {{"end_factor", KILN_OPT_FLOAT, 1, 1, 0.0, 1.0, "0.0", nullptr},
                       {"hold_iters", KILN_OPT_INT, 1, 0, 0.0, 0.0, "0", nullptr},
                       {"mode", KILN_OPT_STRING, 0, 0, 0.0, 0.0, "\"linear\"", "linear,constant"},
                       {"strict", KILN_OPT_BOOL, 0, 0, 0.0, 0.0, "false", nullptr}};
  for (size_t i = 0; i < 4; ++i) {
    const kiln_option_spec& o = cd.options[i];
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(o.struct_size, sizeof(kiln_option_spec));
    EXPECT_STREQ(o.name, want[i].name);
    EXPECT_EQ(o.type, want[i].type);
    EXPECT_EQ(o.has_min, want[i].has_min);
    EXPECT_EQ(o.has_max, want[i].has_max);
    EXPECT_EQ(o.reserved, 0);
    if (o.has_min) {
      EXPECT_EQ(o.min, want[i].min);
    }
    if (o.has_max) {
      EXPECT_EQ(o.max, want[i].max);
    }
    EXPECT_STREQ(o.default_value, want[i].default_value);
    if (want[i].choices == nullptr) {
      EXPECT_EQ(o.choices, nullptr);
    } else {
      EXPECT_STREQ(o.choices, want[i].choices);
    }
    EXPECT_NE(o.doc, nullptr);
  }

  // Through the vtable: 10 iterations, 2 held, decaying to half.
  const auto* vt = static_cast<const kiln_lr_policy_vtable*>(cd.vtable);
  EXPECT_EQ(vt->struct_size, sizeof(kiln_lr_policy_vtable));
  kiln_option_value values[4] = {};
  for (auto& v : values) v.struct_size = sizeof(kiln_option_value);
  values[0].name = "end_factor";
  values[0].type = KILN_OPT_FLOAT;
  values[0].float_value = 0.5;
  values[1].name = "hold_iters";
  values[1].type = KILN_OPT_INT;
  values[1].int_value = 2;
  values[2].name = "mode";
  values[2].type = KILN_OPT_STRING;
  values[2].string_value = "linear";
  values[3].name = "strict";
  values[3].type = KILN_OPT_BOOL;
  values[3].bool_value = 1;
  const kiln_options options{sizeof(kiln_options), 4, values};
  kiln_lr_schedule schedule{sizeof(kiln_lr_schedule), 0.2, 10, 0, 5};
  void* instance = nullptr;
  kiln::plugin::check(vt->create(kiln::plugin::host_api(), &options, &schedule, &instance),
                      "c_linear create");
  double lr = 0.0;
  for (int64_t iter : {1, 3, 7, 11}) {
    kiln::plugin::check(vt->lr_at(instance, iter, &lr), "c_linear lr_at");
    const double t = std::min(1.0, std::max(0.0, (iter - 3) / 8.0));
    EXPECT_DOUBLE_EQ(lr, 0.2 * (1.0 - 0.5 * t)) << iter;
  }
  vt->destroy(instance);
  // A refusal comes back as a status with the plugin's message.
  schedule.max_iters = 2;
  kiln_status* status = vt->create(kiln::plugin::host_api(), &options, &schedule, &instance);
  ASSERT_NE(status, nullptr);
  EXPECT_EQ(kiln::plugin::take_message(status), "c_linear: hold_iters >= max_iters");
}

// good_c_optimizer.c built against the frozen ABI 1.5 headers: the positional initialisers that
// plugins copied before 1.6 still load, reported as 1.5.
TEST(AbiContract, APluginBuiltForAbi15StillLoads) {
  Registry registry;
  const std::string path = std::string(KILN_FROZEN_V1_5_DIR) + "/libgood_c_optimizer.so";
  ASSERT_EQ(refusal(path, registry), "");
  const kiln::plugin::Component* c = registry.find(KILN_COMPONENT_OPTIMIZER, "c_sgd");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->plugin->abi_major, 1u);
  EXPECT_EQ(c->plugin->abi_minor, 5u);
  EXPECT_EQ(c->plugin->torch_version, nullptr);
}

}  // namespace
