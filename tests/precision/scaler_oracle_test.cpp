// The dynamic loss scale against torch.amp.GradScaler (tests/oracle/grad_scaler.py): scripted
// patterns of clean and overflowing steps drive a created instance and a real GradScaler, and
// the scale after every update must be identical (with hysteresis 1 and bounds that never bind).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "precision_harness.hpp"
#include "scratch.hpp"

namespace kiln::precision_test {
namespace {

struct Case {
  std::string name;
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  std::vector<int> finite;  // 1: clean step, 0: overflow
};

std::vector<int> repeat(std::initializer_list<std::pair<int, int>> runs) {
  std::vector<int> out;
  for (const auto& [value, count] : runs) out.insert(out.end(), count, value);
  return out;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"clean_interval3", 65536.0, 2.0, 0.5, 3, repeat({{1, 20}})});
  out.push_back({"bursts", 1024.0, 2.0, 0.5, 2,
                 repeat({{1, 5}, {0, 4}, {1, 6}, {0, 2}, {1, 1}, {0, 1}, {1, 7}, {0, 3}, {1, 4}})});
  std::vector<int> alternating;
  for (int i = 0; i < 30; ++i) alternating.push_back(i % 2 == 0 ? 1 : 0);
  out.push_back({"alternating_interval1", 256.0, 2.0, 0.5, 1, alternating});
  out.push_back({"alternating_interval2", 256.0, 2.0, 0.5, 2, alternating});
  // Falls from the start: the overflows come before any growth.
  out.push_back({"overflow_first", 65536.0, 2.0, 0.5, 1, repeat({{0, 12}, {1, 6}, {0, 1}})});
  std::mt19937 rng(20240611);
  std::bernoulli_distribution overflow(0.15);
  std::vector<int> random;
  for (int i = 0; i < 200; ++i) random.push_back(overflow(rng) ? 0 : 1);
  out.push_back({"random200_interval5", 65536.0, 2.0, 0.5, 5, random});
  out.push_back({"growth4_backoff_quarter", 4096.0, 4.0, 0.25, 3,
                 repeat({{1, 7}, {0, 2}, {1, 3}, {0, 1}, {1, 10}, {0, 3}, {1, 6}})});
  return out;
}

// The TOML lines that make a dynamic GradScaler-equivalent instance of `c`.
std::string scaling_toml(const Case& c, bool with_dtype) {
  std::ostringstream toml;
  if (with_dtype) toml << "dtype = \"fp16\"\n";
  toml << "scaling = \"dynamic\"\nhysteresis = 1\n"
       << "init_scale = " << toml_float(c.init_scale) << "\n"
       << "growth_factor = " << toml_float(c.growth_factor) << "\n"
       << "backoff_factor = " << toml_float(c.backoff_factor) << "\n"
       << "growth_interval = " << c.growth_interval << "\n"
       << "min_scale = " << toml_float(std::ldexp(1.0, -30)) << "\n"
       << "max_scale = " << toml_float(std::ldexp(1.0, 60)) << "\n";
  return toml.str();
}

// Scales after each update of an instance of `component`.
std::vector<double> kiln_scales(const std::string& component, const Case& c) {
  const bool has_dtype = component == "amp" || component == "O1" || component == "o2" ||
                         component == "O2" || component == "o3" || component == "O3";
  Instance instance(component, scaling_toml(c, has_dtype));
  const kiln_precision_policy policy = instance.policy();
  EXPECT_EQ(policy.loss_scaling, KILN_SCALE_DYNAMIC) << component;
  EXPECT_EQ(policy.initial_scale, c.init_scale) << component;
  std::vector<double> scales;
  double scale = policy.initial_scale;
  for (int finite : c.finite) {
    scale = instance.update(finite != 0, scale);
    scales.push_back(scale);
  }
  return scales;
}

class GradScalerOracle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    kiln::test::Scratch scratch;
    std::ostringstream cfg;
    cfg.precision(17);
    cfg << "{\"cases\": [";
    const std::vector<Case> all = cases();
    for (size_t i = 0; i < all.size(); ++i) {
      const Case& c = all[i];
      cfg << (i ? ", " : "") << "{\"name\": \"" << c.name << "\", \"init_scale\": " << c.init_scale
          << ", \"growth_factor\": " << c.growth_factor
          << ", \"backoff_factor\": " << c.backoff_factor
          << ", \"growth_interval\": " << c.growth_interval << ", \"finite\": [";
      for (size_t s = 0; s < c.finite.size(); ++s) cfg << (s ? ", " : "") << c.finite[s];
      cfg << "]}";
    }
    cfg << "]}";
    scratch.write_text("config.json", cfg.str());
    scratch.run("grad_scaler.py");
    want_ = new std::map<std::string, std::vector<double>>();
    for (const Case& c : all) {
      (*want_)[c.name] = scratch.read_doubles(c.name + ".bin", c.finite.size());
    }
  }
  static void TearDownTestSuite() {
    delete want_;
    want_ = nullptr;
  }

  static void expect_same(const std::string& component, const Case& c) {
    const std::vector<double>& want = want_->at(c.name);
    const std::vector<double> got = kiln_scales(component, c);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < want.size(); ++s) {
      // Exact: every scale is a power of two times init_scale.
      ASSERT_EQ(got[s], want[s]) << component << " / " << c.name << ": first difference at step "
                                 << s << " (grads " << (c.finite[s] ? "finite" : "overflowed")
                                 << ")";
    }
  }

  static std::map<std::string, std::vector<double>>* want_;
};
std::map<std::string, std::vector<double>>* GradScalerOracle::want_ = nullptr;

TEST_F(GradScalerOracle, EveryPatternMatchesGradScalerExactly) {
  for (const Case& c : cases()) expect_same("amp", c);
}

TEST_F(GradScalerOracle, ThePatternsExerciseGrowthAndBackoff) {
  // A broken oracle (or rule) that never moved the scale would pass the comparison vacuously.
  // Between them the patterns grow and back off (checked here without the plugin).
  for (const Case& c : cases()) {
    const std::vector<double>& want = want_->at(c.name);
    bool grew = false, shrank = false;
    double previous = c.init_scale;
    for (double s : want) {
      grew = grew || s > previous;
      shrank = shrank || s < previous;
      previous = s;
    }
    // It grows exactly when some run of clean steps reaches growth_interval (alternating with
    // interval 2 never does: each overflow restarts the count).
    int64_t run = 0, longest = 0;
    for (int finite : c.finite) longest = std::max(longest, run = finite ? run + 1 : 0);
    EXPECT_EQ(grew, longest >= c.growth_interval) << c.name;
    const bool has_overflow = std::find(c.finite.begin(), c.finite.end(), 0) != c.finite.end();
    EXPECT_EQ(shrank, has_overflow) << c.name;
  }
}

TEST_F(GradScalerOracle, EveryScaledComponentSharesTheRule) {
  const std::vector<Case> all = cases();
  for (const char* component : {"O1", "16-mixed", "o2", "O2", "o3", "O3", "16-true"}) {
    for (const Case& c : all) expect_same(component, c);
  }
}

}  // namespace
}  // namespace kiln::precision_test
