// Every refusal of the plugin loader, with its exact message, and the acceptance of good plugins.
#include "plugin/loader.hpp"

#include <gtest/gtest.h>
#include <torch/version.h>

#include <boost/filesystem.hpp>

#include "kiln/plugin.h"
#include "kiln_test_paths.h"
#include "plugin/adapters.hpp"
#include "plugin/host_api.hpp"

namespace fs = boost::filesystem;  // libtorch exports clashing std::filesystem symbols
using kiln::plugin::LibraryLoader;
using kiln::plugin::LoadError;
using kiln::plugin::Registry;

namespace {

std::string test_plugin(const std::string& name) {
  return std::string(KILN_TEST_PLUGIN_DIR) + "/lib" + name + ".so";
}
std::string good_plugin(const std::string& name) {
  return std::string(KILN_TEST_PLUGIN_DIR) + "/good/lib" + name + ".so";
}

// The message a load of `path` fails with ("" when it loads).
std::string refusal(const std::string& path, Registry* registry = nullptr) {
  LibraryLoader loader(kiln::plugin::host_api());
  Registry local;
  try {
    loader.load_library(path, registry ? *registry : local);
  } catch (const LoadError& e) {
    EXPECT_EQ(e.path(), path);
    return e.what();
  }
  return "";
}

TEST(LibraryLoader, RefusesAFileThatIsNotALibrary) {
  const std::string path = test_plugin("not_elf");
  std::string message = refusal(path);
  EXPECT_EQ(message.rfind(path + ": cannot load: ", 0), 0u) << message;
}

TEST(LibraryLoader, RefusesAMissingFile) {
  const std::string path = test_plugin("does_not_exist");
  std::string message = refusal(path);
  EXPECT_EQ(message.rfind(path + ": cannot load: ", 0), 0u) << message;
}

TEST(LibraryLoader, RefusesALibraryWithoutKilnSymbols) {
  const std::string path = test_plugin("bad_no_entry");
  EXPECT_EQ(refusal(path),
            path + ": not a Kiln plugin: it exports neither kiln_plugin_abi nor kiln_plugin_get");
}

TEST(LibraryLoader, RefusesAnotherAbiMajor) {
  const std::string path = test_plugin("bad_abi_major");
  EXPECT_EQ(refusal(path), path + ": built for Kiln ABI 99.0, this host speaks " +
                               std::to_string(KILN_ABI_MAJOR) + "." +
                               std::to_string(KILN_ABI_MINOR) + " (the major version must match)");
}

TEST(LibraryLoader, RefusesANewerAbiMinor) {
  const std::string path = test_plugin("bad_abi_minor_newer");
  const std::string host = std::to_string(KILN_ABI_MAJOR) + "." + std::to_string(KILN_ABI_MINOR);
  const std::string newer =
      std::to_string(KILN_ABI_MAJOR) + "." + std::to_string(KILN_ABI_MINOR + 1);
  EXPECT_EQ(refusal(path), path + ": built for Kiln ABI " + newer + ", newer than this host's " +
                               host + "; upgrade Kiln");
}

TEST(LibraryLoader, RefusesADescriptorThatIsTooSmall) {
  const std::string path = test_plugin("bad_struct_small");
  EXPECT_EQ(refusal(path), path + ": plugin descriptor is " +
                               std::to_string(offsetof(kiln_plugin_descriptor, init)) +
                               " bytes, smaller than the " +
                               std::to_string(KILN_PLUGIN_DESCRIPTOR_V1_SIZE) +
                               " bytes of ABI 1.0");
}

TEST(LibraryLoader, RefusesAComponentDescriptorThatIsTooSmall) {
  const std::string path = test_plugin("bad_component_small");
  EXPECT_EQ(refusal(path), path + ": component #0 descriptor is " +
                               std::to_string(offsetof(kiln_component_descriptor, vtable)) +
                               " bytes, smaller than the " +
                               std::to_string(KILN_COMPONENT_DESCRIPTOR_V1_SIZE) +
                               " bytes of ABI 1.0");
}

TEST(LibraryLoader, RefusesAMissingRequiredSlot) {
  const std::string path = test_plugin("bad_missing_slot");
  EXPECT_EQ(refusal(path),
            path + ": component 'no_step_opt' (optimizer): required slot 'step' is NULL (an " +
                "optimizer of ABI 1.14 may give step_all instead)");
}

TEST(LibraryLoader, RefusesAModelBuiltAgainstAnotherTorch) {
  const std::string path = test_plugin("bad_torch_mismatch");
  EXPECT_EQ(refusal(path), path +
                               ": built against LibTorch 1.13.0 (C++11 ABI 0), this host uses "
                               "LibTorch " TORCH_VERSION " (C++11 ABI 1)");
}

TEST(LibraryLoader, RefusesTwoComponentsWithOneName) {
  const std::string path = test_plugin("bad_duplicate");
  EXPECT_EQ(refusal(path), path + ": component name 'dup_opt' appears twice in this library");
}

TEST(LibraryLoader, RefusesANameAnotherLibraryProvides) {
  Registry registry;
  const std::string path = good_plugin("good_c_optimizer");
  EXPECT_EQ(refusal(path, &registry), "");
  const std::string absolute = fs::absolute(path).lexically_normal().string();
  EXPECT_EQ(refusal(path, &registry),
            path + ": component 'c_sgd' (optimizer) is already provided by " + absolute);
}

TEST(LibraryLoader, RefusesAPluginWhoseInitFails) {
  const std::string path = test_plugin("bad_init");
  EXPECT_EQ(refusal(path), path + ": init failed: init refused: no licence file");
}

// Options share the component's pipeline table with the keys the host owns there, so an option
// named like one of them (or with a default its type cannot hold) would break every pipeline
// using the component: the library is refused when it loads.
TEST(LibraryLoader, RefusesAnOptionNamedLikeAHostKey) {
  const std::string path = test_plugin("bad_reserved_option");
  const std::string why = refusal(path);
  EXPECT_EQ(why.rfind(path + ": component 'decaying_opt' (optimizer) option 'weight_decay' is a "
                             "name the host reserves in [optimizer] (name, lr, weight_decay",
                      0),
            0u)
      << why;
  EXPECT_NE(why.find("see docs/abi.md"), std::string::npos) << why;
}

TEST(LibraryLoader, RefusesAnOptionWhoseDefaultIsNotOfItsType) {
  const std::string path = test_plugin("bad_default");
  EXPECT_EQ(refusal(path), path +
                               ": component 'bad_default_opt' (optimizer) option 'beta': "
                               "default \"high\" is not a valid float");
}

TEST(LibraryLoader, AcceptsThePlainCPlugin) {
  Registry registry;
  EXPECT_EQ(refusal(good_plugin("good_c_optimizer"), &registry), "");
  ASSERT_NE(registry.find(KILN_COMPONENT_OPTIMIZER, "c_sgd"), nullptr);
  EXPECT_EQ(registry.find(KILN_COMPONENT_MODEL, "c_sgd"), nullptr);
}

TEST(LibraryLoader, LoadsEveryBuiltInPlugin) {
  LibraryLoader loader(kiln::plugin::host_api());
  Registry registry;
  std::vector<std::string> refused;
  loader.load_directory(KILN_PLUGIN_DIR, registry, refused);
  EXPECT_TRUE(refused.empty()) << refused.front();
  for (auto [kind, name] :
       std::vector<std::pair<int32_t, const char*>>{{KILN_COMPONENT_OPTIMIZER, "sgd"},
                                                    {KILN_COMPONENT_LR_POLICY, "step"},
                                                    {KILN_COMPONENT_LR_POLICY, "cosine"},
                                                    {KILN_COMPONENT_PRECISION, "fp32"},
                                                    {KILN_COMPONENT_NORM, "batchnorm"},
                                                    {KILN_COMPONENT_MODEL, "mlp"},
                                                    {KILN_COMPONENT_MODEL, "resnet"},
                                                    {KILN_COMPONENT_DATASET, "cifar10"},
                                                    {KILN_COMPONENT_DATASET, "fashion-mnist"}}) {
    EXPECT_NE(registry.find(kind, name), nullptr) << name;
  }
}

TEST(LibraryLoader, ScanningAFolderCollectsEveryRefusalAndKeepsGoing) {
  LibraryLoader loader(kiln::plugin::host_api());
  Registry registry;
  std::vector<std::string> refused;
  loader.load_directory(KILN_TEST_PLUGIN_DIR, registry, refused);
  // Nineteen broken libraries in the folder; the good ones live in good/.
  EXPECT_EQ(refused.size(), 19u);
  EXPECT_TRUE(registry.all().empty());
  refused.clear();
  loader.load_directory(std::string(KILN_TEST_PLUGIN_DIR) + "/nowhere", registry, refused);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0],
            std::string(KILN_TEST_PLUGIN_DIR) + "/nowhere: plugin folder does not exist");
}

}  // namespace

namespace {

TEST(Capabilities, ACpuOnlyPluginIsRefusedOnCudaWithTheReason) {
  LibraryLoader loader(kiln::plugin::host_api());
  Registry registry;
  loader.load_library(good_plugin("good_c_optimizer"), registry);
  const auto* c_sgd = registry.find(KILN_COMPONENT_OPTIMIZER, "c_sgd");
  ASSERT_NE(c_sgd, nullptr);
  EXPECT_EQ(kiln::plugin::capability_problem(*c_sgd, c10::DeviceType::CPU, at::kFloat), "");
  EXPECT_EQ(kiln::plugin::capability_problem(*c_sgd, c10::DeviceType::CUDA, at::kFloat),
            "optimizer 'c_sgd' supports devices: cpu; the pipeline runs on cuda");
  EXPECT_EQ(kiln::plugin::capability_problem(*c_sgd, c10::DeviceType::CPU, at::kHalf),
            "optimizer 'c_sgd' does not support dtype Half which the pipeline's precision uses");
}

}  // namespace
