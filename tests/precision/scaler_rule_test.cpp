// The dynamic loss-scale rule in closed form where it goes beyond GradScaler: hysteresis
// (DeepSpeed's delayed shift), the min_scale floor and max_scale cap, static and absent scaling,
// the defaults, and instances keeping their own counters.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "precision_harness.hpp"

namespace kiln::precision_test {
namespace {

constexpr bool C = true;   // a clean step
constexpr bool O = false;  // an overflow

// The scale after each step of `steps`, from the policy's initial scale.
std::vector<double> run(Instance& instance, const std::vector<bool>& steps) {
  std::vector<double> out;
  double scale = instance.policy().initial_scale;
  for (bool finite : steps) out.push_back(scale = instance.update(finite, scale));
  return out;
}

const std::string kFp16Dynamic = "dtype = \"fp16\"\nscaling = \"dynamic\"\n";

TEST(ScaleRule, HysteresisTwoBacksOffOnTheSecondOverflowInARow) {
  Instance amp("amp", kFp16Dynamic + "init_scale = 1024.0\nhysteresis = 2\n");
  // O: tolerated; O: halves; O: halves again (the allowance is spent until a clean step);
  // C: resets the allowance; O: tolerated; C; O: tolerated; O: halves.
  EXPECT_EQ(run(amp, {O, O, O, C, O, C, O, O}),
            (std::vector<double>{1024, 512, 256, 256, 256, 256, 256, 128}));
}

TEST(ScaleRule, HysteresisThreeToleratesTwoOverflows) {
  Instance amp("amp", kFp16Dynamic + "init_scale = 1024.0\nhysteresis = 3\n");
  EXPECT_EQ(run(amp, {O, O, O, O, C, O, O, C, O, O, O}),
            (std::vector<double>{1024, 1024, 512, 256, 256, 256, 256, 256, 256, 256, 128}));
}

TEST(ScaleRule, AToleratedOverflowStillRestartsTheGrowthCount) {
  Instance amp("amp", kFp16Dynamic + "init_scale = 64.0\nhysteresis = 2\ngrowth_interval = 2\n");
  // C, O (tolerated, count restarts), C: only one clean step since; C: grows.
  EXPECT_EQ(run(amp, {C, O, C, C, C, C}), (std::vector<double>{64, 64, 64, 128, 128, 256}));
}

TEST(ScaleRule, NeverBacksOffBelowMinScale) {
  Instance amp("amp", kFp16Dynamic + "init_scale = 4.0\nmin_scale = 1.0\n");
  EXPECT_EQ(run(amp, {O, O, O, O}), (std::vector<double>{2, 1, 1, 1}));
  // A floor that is not a power-of-two step away is met exactly.
  Instance odd("amp", kFp16Dynamic + "init_scale = 4.0\nmin_scale = 3.0\n");
  EXPECT_EQ(run(odd, {O, O, C}), (std::vector<double>{3, 3, 3}));
  EXPECT_EQ(odd.policy().min_scale, 3.0);
}

TEST(ScaleRule, NeverGrowsAboveMaxScale) {
  Instance amp("amp", kFp16Dynamic + "init_scale = 4194304.0\ngrowth_interval = 1\n");
  // The default cap is apex's 2^24.
  EXPECT_EQ(run(amp, {C, C, C, O, C}),
            (std::vector<double>{8388608, 16777216, 16777216, 8388608, 16777216}));
  Instance odd("amp", kFp16Dynamic + "init_scale = 16.0\ngrowth_interval = 1\nmax_scale = 50.0\n");
  EXPECT_EQ(run(odd, {C, C, C, O}), (std::vector<double>{32, 50, 50, 25}));
}

TEST(ScaleRule, DefaultsAreGradScalersWithApexsCap) {
  Instance amp("amp", "dtype = \"fp16\"\n");
  const kiln_precision_policy p = amp.policy();
  EXPECT_EQ(p.loss_scaling, KILN_SCALE_DYNAMIC);
  EXPECT_EQ(p.initial_scale, 65536.0);
  EXPECT_EQ(p.min_scale, 1.0);
  EXPECT_EQ(p.at_min_scale, KILN_AT_MIN_SCALE_STOP);
  double scale = p.initial_scale;
  // growth_interval 2000, growth 2: 1999 clean steps keep it, the 2000th doubles it.
  for (int i = 0; i < 1999; ++i) scale = amp.update(C, scale);
  EXPECT_EQ(scale, 65536.0);
  EXPECT_EQ(scale = amp.update(C, scale), 131072.0);
  // Backoff 0.5.
  EXPECT_EQ(scale = amp.update(O, scale), 65536.0);
  // Up to 2^24 in 8 growths, and no further.
  for (int i = 0; i < 2000 * 10; ++i) scale = amp.update(C, scale);
  EXPECT_EQ(scale, 16777216.0);
}

TEST(ScaleRule, StaticScalingNeverChanges) {
  Instance amp("amp", "dtype = \"fp16\"\nscaling = \"static\"\ninit_scale = 128.0\n");
  const kiln_precision_policy p = amp.policy();
  EXPECT_EQ(p.loss_scaling, KILN_SCALE_STATIC);
  EXPECT_EQ(p.initial_scale, 128.0);
  EXPECT_EQ(p.min_scale, 0.0);  // the host never applies at_min_scale
  EXPECT_EQ(run(amp, {O, O, C, O}), (std::vector<double>{128, 128, 128, 128}));
  // Bounds do not apply to a static scale.
  Instance low("o2", "dtype = \"fp16\"\nscaling = \"static\"\ninit_scale = 0.25\n");
  EXPECT_EQ(low.policy().initial_scale, 0.25);
}

TEST(ScaleRule, NoScalingKeepsOne) {
  Instance amp("amp", "dtype = \"bf16\"\n");
  EXPECT_EQ(amp.policy().loss_scaling, KILN_SCALE_NONE);
  EXPECT_EQ(run(amp, {O, C, O}), (std::vector<double>{1, 1, 1}));
  // Components without scaling options have no rule at all.
  for (const char* name : {"fp32", "O0", "32-true", "bf16", "bf16-mixed", "bf16-true"}) {
    EXPECT_EQ(vtable(name).update_scale, nullptr) << name;
  }
}

TEST(ScaleRule, InstancesKeepTheirOwnCounters) {
  const std::string toml = kFp16Dynamic + "init_scale = 8.0\ngrowth_interval = 2\n";
  Instance a("amp", toml), b("amp", toml);
  double sa = 8, sb = 8;
  sa = a.update(C, sa);  // a: 1 clean
  sb = b.update(O, sb);  // b: backoff
  sa = a.update(C, sa);  // a: 2 clean, grows
  sb = b.update(C, sb);  // b: 1 clean
  EXPECT_EQ(sa, 16.0);
  EXPECT_EQ(sb, 4.0);
  EXPECT_EQ(b.update(C, sb), 8.0);
}

TEST(ScaleRule, RefusesAScaleThatIsNotFinitePositive) {
  Instance amp("amp", kFp16Dynamic);
  EXPECT_EQ(amp.update_refusal(C, 0.0),
            "code 1: amp: update_scale got a loss scale of 0 (must be finite, > 0)");
  EXPECT_EQ(amp.update_refusal(O, std::numeric_limits<double>::infinity()),
            "code 1: amp: update_scale got a loss scale of inf (must be finite, > 0)");
  EXPECT_EQ(amp.update_refusal(C, std::nan("")),
            "code 1: amp: update_scale got a loss scale of nan (must be finite, > 0)");
  // The refusals touched no counter: growth still comes after 2000 clean steps.
  double scale = 65536.0;
  for (int i = 0; i < 2000; ++i) scale = amp.update(C, scale);
  EXPECT_EQ(scale, 131072.0);
}

}  // namespace
}  // namespace kiln::precision_test
