// plateau (ABI 1.15: observe, get_state, set_state) against torch's ReduceLROnPlateau
// (tests/oracle/lr_plateau.py) on the same metrics: every mode (min, max) and threshold mode
// (rel, abs), with patience, cooldown, a floor (min_lr) the rate reaches, and an eps that stops
// a lowering. The rate after each observation must equal torch's bit for bit (both compute it in
// double from the same operations), and a policy restored from get_state into a fresh instance
// halfway must continue as the uninterrupted one.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "lr_harness.hpp"
#include "scratch.hpp"

namespace kiln::lr_test {
namespace {

constexpr double kBase = 0.4;

struct PlateauCase {
  std::string name;
  std::string mode, threshold_mode, metric;
  double factor, threshold, min_lr, eps;
  int64_t patience, cooldown;
  std::vector<double> metrics;
};

// A metric that improves, stalls (flat, then within the threshold), improves again and
// wobbles: `rising` mirrors it for mode max. Deterministic, exact in binary where it matters.
std::vector<double> trajectory(bool rising) {
  std::vector<double> out;
  double v = 2.0;
  for (int i = 0; i < 80; ++i) {
    if (i < 10) {
      v *= 0.9;  // improving
    } else if (i < 25) {
      v *= 1.0 - 1e-5;  // stalled: better by less than a rel threshold of 1e-4
    } else if (i < 35) {
      v -= 0.01;  // improving by 0.01 per evaluation (abs threshold 0.02 calls it a stall)
    } else {
      v += (i % 3 == 0 ? 0.003 : -0.001);  // wobbling
    }
    out.push_back(rising ? 3.0 - v : v);
  }
  return out;
}

std::vector<PlateauCase> cases() {
  std::vector<PlateauCase> out;
  for (const char* mode : {"min", "max"}) {
    for (const char* tmode : {"rel", "abs"}) {
      const bool max = std::string(mode) == "max";
      const std::string tag = std::string(mode) + "_" + tmode;
      const double threshold = std::string(tmode) == "rel" ? 1e-4 : 0.02;
      out.push_back({tag, mode, tmode, max ? "top1" : "loss", 0.5, threshold, 0.0, 1e-8, 2, 0,
                     trajectory(max)});
      out.push_back({tag + "_cooldown_floor", mode, tmode, max ? "top5" : "loss", 0.3, threshold,
                     0.02, 1e-8, 1, 2, trajectory(max)});
      // eps larger than the last lowerings: the rate stops where a lowering would be < eps.
      out.push_back({tag + "_eps", mode, tmode, max ? "top1" : "loss", 0.5, threshold, 0.0, 0.04, 0,
                     0, trajectory(max)});
    }
  }
  return out;
}

std::string kwargs(const PlateauCase& c) {
  std::ostringstream s;
  s.precision(17);
  s << R"({"mode": ")" << c.mode << R"(", "threshold_mode": ")" << c.threshold_mode
    << R"(", "factor": )" << c.factor << R"(, "threshold": )" << c.threshold << R"(, "min_lr": )"
    << c.min_lr << R"(, "eps": )" << c.eps << R"(, "patience": )" << c.patience
    << R"(, "cooldown": )" << c.cooldown << "}";
  return s.str();
}

Options options_of(const PlateauCase& c) {
  Options o;
  o.set_string("metric", c.metric)
      .set_string("mode", c.mode)
      .set_string("threshold_mode", c.threshold_mode)
      .set_float("factor", c.factor)
      .set_float("threshold", c.threshold)
      .set_float("min_lr", c.min_lr)
      .set_float("eps", c.eps)
      .set_int("patience", c.patience)
      .set_int("cooldown", c.cooldown);
  return o;
}

// One evaluation's metrics as the host gives them: loss, top1, top5, the case's own at `value`.
void observe(const kiln_lr_policy_vtable& v, void* instance, const std::string& metric,
             double value, int64_t iter) {
  const char* names[] = {"loss", "top1", "top5"};
  double values[] = {9.0, 0.5, 0.5};
  for (int i = 0; i < 3; ++i) {
    if (metric == names[i]) values[i] = value;
  }
  kiln_lr_observation o{};
  o.struct_size = sizeof(o);
  o.iter = iter;
  o.epoch = iter / 10;
  o.count = 3;
  o.names = names;
  o.values = values;
  Status status(v.observe(instance, &o));
  ASSERT_EQ(status, nullptr) << describe(status.get());
}

const kiln_lr_policy_vtable& plateau_vtable() {
  return *static_cast<const kiln_lr_policy_vtable*>(component("plateau").vtable);
}

std::vector<double> state_of(void* instance) {
  size_t count = 0;
  Status asked(plateau_vtable().get_state(instance, nullptr, 0, &count));
  EXPECT_EQ(asked, nullptr) << describe(asked.get());
  std::vector<double> values(count);
  Status got(plateau_vtable().get_state(instance, values.data(), values.size(), &count));
  EXPECT_EQ(got, nullptr) << describe(got.get());
  return values;
}

TEST(PlateauVsTorch, EveryObservationMatchesReduceLrOnPlateau) {
  const std::vector<PlateauCase> all = cases();
  std::ostringstream json;
  json.precision(17);
  json << R"({"cases": [)";
  for (size_t i = 0; i < all.size(); ++i) {
    json << (i ? ", " : "") << R"({"name": ")" << all[i].name << R"(", "kwargs": )"
         << kwargs(all[i]) << R"(, "base_lr": )" << kBase << R"(, "metrics": [)";
    for (size_t k = 0; k < all[i].metrics.size(); ++k) {
      json << (k ? ", " : "") << all[i].metrics[k];
    }
    json << "]}";
  }
  json << "]}";
  kiln::test::Scratch oracle;
  oracle.write_text("config.json", json.str());
  oracle.run("lr_plateau.py");

  const kiln_lr_policy_vtable& v = plateau_vtable();
  for (const PlateauCase& c : all) {
    SCOPED_TRACE(c.name);
    const std::vector<double> torch_lr = oracle.read_doubles(c.name + ".bin", c.metrics.size());
    Options options = options_of(c);
    Policy policy("plateau");
    Policy resumed("plateau");
    const kiln_lr_schedule schedule = make_schedule(kBase, 1000, 0, 10);
    Status status = policy.create(options, schedule);
    ASSERT_EQ(status, nullptr) << describe(status.get());
    EXPECT_EQ(policy.at(1), kBase);
    size_t lowered = 0;
    const size_t half = c.metrics.size() / 2;
    for (size_t k = 0; k < c.metrics.size(); ++k) {
      const int64_t iter = static_cast<int64_t>(10 * (k + 1));
      observe(v, policy.instance(), c.metric, c.metrics[k], iter);
      ASSERT_EQ(policy.at(iter + 1), torch_lr[k]) << "after evaluation " << k + 1;
      if (k > 0 && torch_lr[k] < torch_lr[k - 1]) ++lowered;
      if (k + 1 == half) {
        // A checkpoint here: a fresh instance takes the state and must go on alike.
        Options again = options_of(c);
        ASSERT_EQ(resumed.create(again, schedule), nullptr);
        const std::vector<double> saved = state_of(policy.instance());
        Status restored(v.set_state(resumed.instance(), saved.data(), saved.size()));
        ASSERT_EQ(restored, nullptr) << describe(restored.get());
      } else if (k + 1 > half) {
        observe(v, resumed.instance(), c.metric, c.metrics[k], iter);
        ASSERT_EQ(resumed.at(iter + 1), policy.at(iter + 1)) << "resumed, evaluation " << k + 1;
      }
    }
    // Each case lowers the rate at least twice, so that the comparison means something.
    EXPECT_GE(lowered, 2u);
  }
}

TEST(PlateauVsTorch, AMetricTheEvaluationLacksIsRefusedByName) {
  Options options;
  options.set_string("metric", "map");
  Policy policy("plateau");
  ASSERT_EQ(policy.create(options, make_schedule(kBase, 100, 0, 10)), nullptr);
  const char* names[] = {"loss", "top1", "top5"};
  const double values[] = {1.0, 0.5, 0.7};
  kiln_lr_observation o{};
  o.struct_size = sizeof(o);
  o.iter = 10;
  o.count = 3;
  o.names = names;
  o.values = values;
  Status status(plateau_vtable().observe(policy.instance(), &o));
  ASSERT_NE(status, nullptr);
  EXPECT_NE(describe(status.get())
                .find("metric 'map' is not among the evaluation's (after step "
                      "10: loss, top1, top5)"),
            std::string::npos)
      << describe(status.get());
  const double bad[] = {-1.0, 0.0, 0.0, 0.0, 0.0};
  Status refused(plateau_vtable().set_state(policy.instance(), bad, 5));
  EXPECT_NE(refused, nullptr);
}

}  // namespace
}  // namespace kiln::lr_test
