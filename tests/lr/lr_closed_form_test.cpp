// Every policy at every iteration after warm-up (and a little past max_iters) against its
// closed form computed here, with and without warm-up, durations in iterations and in epochs.
// Pet's STEP decays at iteration s itself; the torch-named policies (StepLR, MultiStepLR,
// ExponentialLR) train iteration it at torch's last_epoch = it − 1.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "lr_harness.hpp"

namespace kiln::lr_test {
namespace {

constexpr double kBase = 0.4;
constexpr int64_t kMaxIters = 400;
constexpr int64_t kItersPerEpoch = 37;  // not a divisor of kMaxIters: epochs end mid-run
constexpr double kPi = 3.14159265358979323846;

// What a closed form sees: the frame and the duration unit in iterations.
struct Frame {
  int64_t warm;
  int64_t scale;  // iterations per duration unit: kItersPerEpoch with by_epoch, else 1
};

// One policy set-up: its options (given in epochs when by_epoch) and its closed form.
struct Setup {
  std::string name;
  std::string component;
  bool has_durations;
  std::function<void(Options&, bool by_epoch)> options;
  std::function<double(int64_t it, const Frame&)> expected;
};

// How many of `points` (durations, times scale) are <= it: Pet's bisect_right, with repeats.
int64_t reached(const std::vector<int64_t>& points, int64_t scale, int64_t it) {
  int64_t n = 0;
  for (int64_t p : points) n += p * scale <= it ? 1 : 0;
  return n;
}

std::vector<Setup> setups() {
  const std::vector<int64_t> steps_it = {30, 120, 250}, steps_ep = {2, 5, 9};
  const std::vector<int64_t> miles_it = {50, 50, 180, 300}, miles_ep = {2, 2, 6, 8};
  auto pick = [](bool e, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    return e ? b : a;
  };
  std::vector<Setup> s;
  s.push_back({"constant", "constant", false, [](Options&, bool) {},
               [](int64_t, const Frame&) { return kBase; }});
  s.push_back({"step_list", "step", true,
               [=](Options& o, bool e) {
                 o.set_int_list("steps", pick(e, steps_it, steps_ep)).set_float("gamma", 0.1);
                 if (e) o.set_bool("by_epoch", true);
               },
               [=](int64_t it, const Frame& f) {
                 const auto& steps = f.scale == 1 ? steps_it : steps_ep;
                 return kBase * std::pow(0.1, static_cast<double>(reached(steps, f.scale, it)));
               }});
  s.push_back({"step_size", "step", true,
               [](Options& o, bool e) {
                 o.set_int("step_size", e ? 3 : 45).set_float("gamma", 0.5);
                 if (e) o.set_bool("by_epoch", true);
               },
               [](int64_t it, const Frame& f) {
                 const int64_t size = f.scale == 1 ? 45 : 3 * f.scale;
                 return kBase * std::pow(0.5, std::floor(static_cast<double>(it - 1) / size));
               }});
  s.push_back({"multistep", "multistep", true,
               [=](Options& o, bool e) {
                 o.set_int_list("milestones", pick(e, miles_it, miles_ep)).set_float("gamma", 0.3);
                 if (e) o.set_bool("by_epoch", true);
               },
               [=](int64_t it, const Frame& f) {
                 const auto& miles = f.scale == 1 ? miles_it : miles_ep;
                 return kBase * std::pow(0.3, static_cast<double>(reached(miles, f.scale, it - 1)));
               }});
  s.push_back({"multistep_none", "multistep", true,
               [](Options& o, bool e) {
                 o.set_int_list("milestones", {});
                 if (e) o.set_bool("by_epoch", true);
               },
               [](int64_t, const Frame&) { return kBase; }});
  for (double min_lr : {0.0, 0.01}) {
    s.push_back({min_lr == 0.0 ? "cosine" : "cosine_min", "cosine", false,
                 [=](Options& o, bool) { o.set_float("min_lr", min_lr); },
                 [=](int64_t it, const Frame& f) {
                   // Pet's COSINE: base at it = warm + 1, continuing as a cosine past the end.
                   const double t = static_cast<double>(it - f.warm - 1) / (kMaxIters - f.warm);
                   return min_lr + (kBase - min_lr) * 0.5 * (std::cos(t * kPi) + 1.0);
                 }});
  }
  for (auto [power, min_lr] : {std::pair{0.9, 0.0}, std::pair{2.0, 0.004}}) {
    s.push_back({min_lr == 0.0 ? "poly" : "poly_min", "poly", false,
                 [=](Options& o, bool) { o.set_float("power", power).set_float("min_lr", min_lr); },
                 [=](int64_t it, const Frame& f) {
                   // Pet's POLY: base at it = warm + 1, reaching min_lr at max + 1 and staying.
                   double left = 1.0 - static_cast<double>(it - f.warm - 1) / (kMaxIters - f.warm);
                   if (left < 0.0) left = 0.0;
                   return min_lr + (kBase - min_lr) * std::pow(left, power);
                 }});
  }
  for (double gamma : {0.99, 1.0}) {
    s.push_back({gamma == 1.0 ? "exp_flat" : "exp", "exp", false,
                 [=](Options& o, bool) { o.set_float("gamma", gamma); },
                 [=](int64_t it, const Frame&) {
                   return kBase * std::pow(gamma, static_cast<double>(it - 1));
                 }});
  }
  return s;
}

struct Case {
  Setup setup;
  int64_t warm;
  bool by_epoch;
};

std::string case_name(const Case& c) {
  return c.setup.name + "_warm" + std::to_string(c.warm) + (c.by_epoch ? "_by_epoch" : "");
}
// gtest prints parameters in test listings (and ctest names); a name reads better than bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const Setup& s : setups()) {
    for (int64_t warm : {int64_t{0}, int64_t{25}}) {
      out.push_back({s, warm, false});
      if (s.has_durations) out.push_back({s, warm, true});
    }
  }
  return out;
}

class ClosedForm : public ::testing::TestWithParam<Case> {};

TEST_P(ClosedForm, EveryIteration) {
  const Case& c = GetParam();
  const kiln_lr_schedule frame = make_schedule(kBase, kMaxIters, c.warm, kItersPerEpoch);
  const Frame f{c.warm, c.by_epoch ? kItersPerEpoch : 1};
  // As a sparse host passes them (the plugin's fallbacks) and as the real host does (every
  // schema option present, defaults filled): both must give the closed form.
  for (bool filled : {false, true}) {
    SCOPED_TRACE(filled ? "defaults filled from the schema" : "only the options set");
    Options options;
    c.setup.options(options, c.by_epoch);
    if (filled) options.fill_defaults(component(c.setup.component));
    Policy policy(c.setup.component);
    Status status = policy.create(options, frame);
    ASSERT_EQ(status, nullptr) << describe(status.get());

    std::vector<double> forward;
    for (int64_t it = c.warm + 1; it <= kMaxIters + 10; ++it) {
      const double got = policy.at(it);
      const double expected = c.setup.expected(it, f);
      ASSERT_NEAR(got, expected, 1e-12 * kBase) << "iter " << it;
      forward.push_back(got);
    }
    // Pure: asking again in reverse order gives the same values bit for bit.
    for (int64_t it = kMaxIters + 10; it > c.warm; --it) {
      ASSERT_EQ(policy.at(it), forward[static_cast<size_t>(it - c.warm - 1)]) << "iter " << it;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, ClosedForm, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return case_name(info.param);
                         });

// The first post-warm-up iteration of the decaying policies starts from the base rate, and the
// last one stays above min_lr (Pet's it − warm − 1 offset).
TEST(ClosedForm, DecaysStartAtBaseAndEndAboveMinLr) {
  for (const char* name : {"cosine", "poly"}) {
    SCOPED_TRACE(name);
    Options options;
    options.set_float("min_lr", 0.01);
    Policy policy(name);
    Status status = policy.create(options, make_schedule(kBase, kMaxIters, 25, kItersPerEpoch));
    ASSERT_EQ(status, nullptr) << describe(status.get());
    EXPECT_EQ(policy.at(26), kBase);
    EXPECT_GT(policy.at(kMaxIters), 0.01);
    EXPECT_LT(policy.at(kMaxIters), 0.01 + 0.01 * kBase);
  }
}

}  // namespace
}  // namespace kiln::lr_test
