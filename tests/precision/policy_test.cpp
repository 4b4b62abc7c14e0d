// What every precision component declares: its policy on CPU and CUDA (dtypes, autocast, master
// weights, norm layers, scaling), each alias equal to its target, what a host older than ABI 1.1
// gets written, and the libraries' descriptors.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "precision_harness.hpp"

namespace kiln::precision_test {
namespace {

constexpr int32_t F32 = KILN_DTYPE_F32, F16 = KILN_DTYPE_F16, BF16 = KILN_DTYPE_BF16;
constexpr int32_t NONE = KILN_SCALE_NONE, STATIC = KILN_SCALE_STATIC, DYN = KILN_SCALE_DYNAMIC;
constexpr int32_t STOP = KILN_AT_MIN_SCALE_STOP, SKIP = KILN_AT_MIN_SCALE_SKIP;

struct Expected {
  std::string component;
  std::string toml;
  DLDeviceType device;
  int32_t model_dtype, autocast, compute_dtype, master_weights, norm_fp32, loss_scaling;
  double initial_scale, min_scale;
  int32_t at_min_scale;
};

std::string where(const Expected& e) {
  return e.component + " on " + (e.device == kDLCUDA ? "cuda" : "cpu") +
         (e.toml.empty() ? "" : " with " + e.toml);
}

void check(const Expected& e) {
  const kiln_precision_policy p = Instance(e.component, e.toml, e.device).policy();
  EXPECT_EQ(p.model_dtype, e.model_dtype) << where(e);
  EXPECT_EQ(p.autocast, e.autocast) << where(e);
  EXPECT_EQ(p.compute_dtype, e.compute_dtype) << where(e);
  EXPECT_EQ(p.master_weights, e.master_weights) << where(e);
  EXPECT_EQ(p.norm_fp32, e.norm_fp32) << where(e);
  EXPECT_EQ(p.loss_scaling, e.loss_scaling) << where(e);
  EXPECT_EQ(p.initial_scale, e.initial_scale) << where(e);
  EXPECT_EQ(p.min_scale, e.min_scale) << where(e);
  EXPECT_EQ(p.at_min_scale, e.at_min_scale) << where(e);
}

TEST(Policy, Fp32AndItsAliases) {
  for (const char* name : {"fp32", "O0", "32-true"}) {
    for (DLDeviceType d : {kDLCPU, kDLCUDA}) {
      check({name, "", d, F32, 0, F32, 0, 1, NONE, 1.0, 0.0, STOP});
    }
  }
}

TEST(Policy, AmpAutocastsToFp16OnCudaAndBf16OnCpu) {
  for (const char* name : {"amp", "O1"}) {
    check({name, "", kDLCUDA, F32, 1, F16, 0, 1, DYN, 65536.0, 1.0, STOP});
    check({name, "", kDLCPU, F32, 1, BF16, 0, 1, NONE, 1.0, 0.0, STOP});
    check({name, "dtype = \"fp16\"", kDLCPU, F32, 1, F16, 0, 1, DYN, 65536.0, 1.0, STOP});
    check({name, "dtype = \"bf16\"", kDLCUDA, F32, 1, BF16, 0, 1, NONE, 1.0, 0.0, STOP});
    // Asked for, bf16 gets scaled too.
    check({name, "dtype = \"bf16\"\nscaling = \"dynamic\"", kDLCUDA, F32, 1, BF16, 0, 1, DYN,
           65536.0, 1.0, STOP});
    check({name, "scaling = \"static\"\ninit_scale = 1024.0", kDLCUDA, F32, 1, F16, 0, 1, STATIC,
           1024.0, 0.0, STOP});
    check({name, "scaling = \"none\"", kDLCUDA, F32, 1, F16, 0, 1, NONE, 1.0, 0.0, STOP});
    check({name, "min_scale = 0.125\nat_min_scale = \"skip\"\ninit_scale = 256", kDLCUDA, F32, 1,
           F16, 0, 1, DYN, 256.0, 0.125, SKIP});
  }
}

TEST(Policy, SixteenMixedIsFp16AutocastWithDynamicScalingOnBothDevices) {
  for (DLDeviceType d : {kDLCPU, kDLCUDA}) {
    check({"16-mixed", "", d, F32, 1, F16, 0, 1, DYN, 65536.0, 1.0, STOP});
    check({"16-mixed", "scaling = \"static\"\ninit_scale = 8.0", d, F32, 1, F16, 0, 1, STATIC, 8.0,
           0.0, STOP});
  }
}

TEST(Policy, Bf16AndBf16MixedAreBf16AutocastWithoutScaling) {
  for (const char* name : {"bf16", "bf16-mixed"}) {
    for (DLDeviceType d : {kDLCPU, kDLCUDA}) {
      check({name, "", d, F32, 1, BF16, 0, 1, NONE, 1.0, 0.0, STOP});
    }
  }
}

TEST(Policy, O2KeepsFp32MasterWeightsOfAHalfModel) {
  for (const char* name : {"o2", "O2"}) {
    check({name, "", kDLCUDA, F16, 0, F16, 1, 1, DYN, 65536.0, 1.0, STOP});
    check({name, "", kDLCPU, BF16, 0, BF16, 1, 1, NONE, 1.0, 0.0, STOP});
    check({name, "keep_norm_fp32 = false", kDLCUDA, F16, 0, F16, 1, 0, DYN, 65536.0, 1.0, STOP});
    check({name, "dtype = \"bf16\"", kDLCUDA, BF16, 0, BF16, 1, 1, NONE, 1.0, 0.0, STOP});
    check({name, "dtype = \"fp16\"\nhysteresis = 2\nmin_scale = 4.0\nat_min_scale = \"skip\"",
           kDLCPU, F16, 0, F16, 1, 1, DYN, 65536.0, 4.0, SKIP});
  }
}

TEST(Policy, O3IsPureHalfWithoutScalingByDefault) {
  for (const char* name : {"o3", "O3"}) {
    check({name, "", kDLCUDA, F16, 0, F16, 0, 0, NONE, 1.0, 0.0, STOP});
    check({name, "", kDLCPU, BF16, 0, BF16, 0, 0, NONE, 1.0, 0.0, STOP});
    check({name, "keep_norm_fp32 = true", kDLCUDA, F16, 0, F16, 0, 1, NONE, 1.0, 0.0, STOP});
    // auto means: dynamic for fp16, none for bf16.
    check({name, "scaling = \"auto\"", kDLCUDA, F16, 0, F16, 0, 0, DYN, 65536.0, 1.0, STOP});
    check({name, "scaling = \"auto\"", kDLCPU, BF16, 0, BF16, 0, 0, NONE, 1.0, 0.0, STOP});
  }
  for (DLDeviceType d : {kDLCPU, kDLCUDA}) {
    check({"16-true", "", d, F16, 0, F16, 0, 0, NONE, 1.0, 0.0, STOP});
    check({"16-true", "scaling = \"dynamic\"", d, F16, 0, F16, 0, 0, DYN, 65536.0, 1.0, STOP});
    check({"bf16-true", "", d, BF16, 0, BF16, 0, 0, NONE, 1.0, 0.0, STOP});
    check({"bf16-true", "keep_norm_fp32 = true", d, BF16, 0, BF16, 0, 1, NONE, 1.0, 0.0, STOP});
  }
}

// ---- aliases --------------------------------------------------------------------------------

struct Alias {
  const char* alias;
  const char* target;
  const char* target_toml;  // what the alias fixes
};
const std::vector<Alias> kAliases = {
    {"O0", "fp32", ""},
    {"32-true", "fp32", ""},
    {"O1", "amp", ""},
    {"16-mixed", "amp", "dtype = \"fp16\"\n"},
    {"bf16-mixed", "bf16", ""},
    {"O2", "o2", ""},
    {"O3", "o3", ""},
    {"16-true", "o3", "dtype = \"fp16\"\n"},
    {"bf16-true", "o3", "dtype = \"bf16\"\n"},
};

const kiln_option_spec* find_option(const kiln_component_descriptor& d, const std::string& name) {
  for (size_t i = 0; i < d.option_count; ++i) {
    if (name == d.options[i].name) return &d.options[i];
  }
  return nullptr;
}
bool has_option(const kiln_component_descriptor& d, const std::string& name) {
  return find_option(d, name) != nullptr;
}
std::string text(const char* s) { return s != nullptr ? s : "(null)"; }

TEST(Alias, EqualsItsTargetsPolicyOnEachDeviceAndWithOptions) {
  const std::vector<std::string> extras = {"", "scaling = \"dynamic\"\ninit_scale = 512.0",
                                           "keep_norm_fp32 = true", "at_min_scale = \"skip\""};
  for (const Alias& a : kAliases) {
    for (const std::string& extra : extras) {
      // Options the alias does not have are not passed to either.
      bool applies = true;
      for (const char* key : {"scaling", "keep_norm_fp32", "at_min_scale"}) {
        if (extra.find(key) == std::string::npos) continue;
        applies = applies && has_option(*component(a.alias).descriptor, key);
      }
      if (!applies) continue;
      for (DLDeviceType d : {kDLCPU, kDLCUDA}) {
        const kiln_precision_policy got = Instance(a.alias, extra, d).policy();
        const kiln_precision_policy want =
            Instance(a.target, std::string(a.target_toml) + extra, d).policy();
        EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
            << a.alias << " vs " << a.target << " on " << (d == kDLCUDA ? "cuda" : "cpu")
            << " with '" << extra << "'";
      }
    }
  }
}

TEST(Alias, OffersItsTargetsOptionsLessTheOnesItFixes) {
  for (const Alias& a : kAliases) {
    const kiln_component_descriptor& alias = *component(a.alias).descriptor;
    const kiln_component_descriptor& target = *component(a.target).descriptor;
    // Everything the alias offers, the target offers with the same type, default and choices.
    for (size_t i = 0; i < alias.option_count; ++i) {
      const kiln_option_spec& o = alias.options[i];
      const kiln_option_spec* t = find_option(target, o.name);
      ASSERT_NE(t, nullptr) << a.alias << "." << o.name;
      EXPECT_EQ(o.type, t->type) << a.alias << "." << o.name;
      EXPECT_EQ(text(o.default_value), text(t->default_value)) << a.alias << "." << o.name;
      EXPECT_EQ(text(o.choices), text(t->choices)) << a.alias << "." << o.name;
    }
    // What the target offers and the alias lacks is the dtype it fixes (and, for bf16-true, the
    // scaling a bf16 model does not need).
    for (size_t i = 0; i < target.option_count; ++i) {
      const std::string name = target.options[i].name;
      if (has_option(alias, name)) continue;
      const bool fixed_dtype = name == "dtype" && std::string(a.target_toml).find("dtype") == 0;
      const bool bf16_unscaled = std::string(a.alias) == "bf16-true";
      EXPECT_TRUE(fixed_dtype || bf16_unscaled) << a.alias << " lacks " << name;
    }
    EXPECT_EQ(std::string(alias.summary).rfind(std::string("alias of ") + a.target, 0), 0u)
        << a.alias << ": " << alias.summary;
  }
}

// ---- hosts of other ABI versions -----------------------------------------------------------

// Calls policy with a struct_size of `size` on a buffer filled with 0xAB; returns the buffer.
std::vector<unsigned char> policy_bytes(const std::string& name, size_t size, DLDeviceType d) {
  Instance instance(name, "", d);
  std::vector<unsigned char> buffer(sizeof(kiln_precision_policy) + 32, 0xAB);
  kiln_precision_policy header;
  header.struct_size = size;
  std::memcpy(buffer.data(), &header.struct_size, sizeof header.struct_size);
  kiln_status* status = instance.vt().policy(
      instance.handle(), reinterpret_cast<kiln_precision_policy*>(buffer.data()));
  EXPECT_EQ(status, nullptr) << name;
  return buffer;
}

TEST(OlderHost, AnAbi10HostGetsOnlyThe10Fields) {
  static_assert(KILN_PRECISION_POLICY_V1_0_SIZE < sizeof(kiln_precision_policy), "1.1 appended");
  for (const std::string& name : all_components()) {
    for (DLDeviceType d : {kDLCPU, kDLCUDA}) {
      const std::vector<unsigned char> bytes =
          policy_bytes(name, KILN_PRECISION_POLICY_V1_0_SIZE, d);
      for (size_t i = KILN_PRECISION_POLICY_V1_0_SIZE; i < bytes.size(); ++i) {
        ASSERT_EQ(bytes[i], 0xAB) << name << " wrote byte " << i << " past a 1.0 host's struct";
      }
      // The 1.0 fields are the full policy's.
      const kiln_precision_policy full = Instance(name, "", d).policy();
      EXPECT_EQ(std::memcmp(bytes.data() + sizeof(size_t),
                            reinterpret_cast<const unsigned char*>(&full) + sizeof(size_t),
                            KILN_PRECISION_POLICY_V1_0_SIZE - sizeof(size_t)),
                0)
          << name;
    }
  }
}

TEST(OlderHost, ANewerHostsTailIsLeftAlone) {
  for (const std::string& name : all_components()) {
    const std::vector<unsigned char> bytes =
        policy_bytes(name, sizeof(kiln_precision_policy) + 32, kDLCUDA);
    for (size_t i = sizeof(kiln_precision_policy); i < bytes.size(); ++i) {
      ASSERT_EQ(bytes[i], 0xAB) << name << " wrote byte " << i << " past its own struct";
    }
  }
}

TEST(OlderHost, AHostPresetIsOverwrittenByA11Plugin) {
  // The host presets min_scale 1 and STOP; the plugins always say what they mean.
  kiln_precision_policy p = Instance("amp", "dtype = \"bf16\"").policy();
  EXPECT_EQ(p.min_scale, 0.0);
  p = Instance("fp32").policy();
  EXPECT_EQ(p.min_scale, 0.0);
}

// ---- libraries -------------------------------------------------------------------------------

TEST(Library, EveryComponentIsAPrecisionPolicyForCpuAndCudaInThreeDtypes) {
  for (const std::string& name : all_components()) {
    const kiln::plugin::Component& c = component(name);
    EXPECT_EQ(c.kind(), KILN_COMPONENT_PRECISION) << name;
    EXPECT_EQ(c.plugin->abi_major, 1u);
    EXPECT_EQ(c.plugin->abi_minor, static_cast<uint32_t>(KILN_ABI_MINOR));
    EXPECT_EQ(c.plugin->torch_version, nullptr) << name;
    EXPECT_EQ(c.plugin->torch_cxx11_abi, -1) << name;
    const uint64_t devices = KILN_CAP_DEVICE_CPU | KILN_CAP_DEVICE_CUDA;
    EXPECT_EQ(c.descriptor->capabilities->flags & devices, devices) << name;
    const bool half = name != "fp32" && name != "O0" && name != "32-true";
    EXPECT_EQ(c.descriptor->capabilities->flags,
              devices | KILN_CAP_DTYPE_F32 |
                  (half ? KILN_CAP_DTYPE_F16 | KILN_CAP_DTYPE_BF16 : uint64_t{0}))
        << name;
    const bool scaled = half && name != "bf16" && name != "bf16-mixed" && name != "bf16-true";
    EXPECT_EQ(vtable(name).update_scale != nullptr, scaled) << name;
  }
}

TEST(Library, ScalingOptionsDefaultToGradScalersValues) {
  for (const char* name : {"amp", "O1", "16-mixed", "o2", "O2", "o3", "O3", "16-true"}) {
    const kiln::config::OptionSet o = resolve(name);
    const bool pure =
        std::string(name) == "o3" || name == std::string("O3") || name == std::string("16-true");
    EXPECT_EQ(o.get_string("scaling"), pure ? "none" : "auto") << name;
    EXPECT_EQ(o.get_float("init_scale"), 65536.0) << name;
    EXPECT_EQ(o.get_float("growth_factor"), 2.0) << name;
    EXPECT_EQ(o.get_float("backoff_factor"), 0.5) << name;
    EXPECT_EQ(o.get_int("growth_interval"), 2000) << name;
    EXPECT_EQ(o.get_int("hysteresis"), 1) << name;
    EXPECT_EQ(o.get_float("min_scale"), 1.0) << name;
    EXPECT_EQ(o.get_float("max_scale"), 16777216.0) << name;
    EXPECT_EQ(o.get_string("at_min_scale"), "stop") << name;
  }
  for (const char* name : {"bf16", "bf16-mixed"}) {
    EXPECT_EQ(component(name).descriptor->option_count, 0u) << name;
  }
}

TEST(Library, NoDependencyOnLibTorchOrTheCxxRuntime) {
  for (const char* name : {"amp", "fp32"}) {
    const std::string& path = component(name).library_path;
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(bytes.empty()) << path;
    for (const char* lib : {"libtorch", "libc10", "libstdc++"}) {
      EXPECT_EQ(bytes.find(lib), std::string::npos) << path << " refers to " << lib;
    }
  }
}

}  // namespace
}  // namespace kiln::precision_test
