// The policies alone (no host warm-up) against PyTorch's schedulers (tests/oracle/
// lr_schedulers.py, run once for all cases), wherever PyTorch has the same schedule. Kiln's
// lr_at(it) is compared with the torch rate at last_epoch = e(it); iteration it is the it-th
// optimizer step, which torch trains at last_epoch = it − 1 (lr_reference_test.cpp checks whole
// schedules, warm-up included, against the references the docs name):
//  - step with step_size, multistep and exp are StepLR, MultiStepLR and ExponentialLR counted
//    from the start of the run: e = it − 1; with by_epoch, torch is stepped once per epoch (its
//    by-epoch use) and e = floor((it − 1) / iters_per_epoch);
//  - step with steps is Pet's STEP, which decays at iteration s itself: MultiStepLR one
//    iteration ahead, e = it (e = floor(it / iters_per_epoch) with by_epoch);
//  - cosine and poly start from base_lr at the first post-warm-up iteration (Pet's
//    it − warm − 1): CosineAnnealingLR / PolynomialLR over T = max − warm at e = it − warm − 1.
//    poly with min_lr > 0 has no torch counterpart (PolynomialLR has no floor); cosine's min_lr
//    is eta_min. Past max_iters PyTorch's cosine keeps its recursive form, so cosine is compared
//    up to max_iters only (the host never asks beyond); poly is compared past it (both hold 0).
//  - cosine_restarts, one_cycle, cyclic and linear start after warm-up too:
//    CosineAnnealingWarmRestarts, OneCycleLR (total_steps = max − warm, max_lr = base_lr),
//    CyclicLR (base_lr = the base lr) and LinearLR at e = it − warm − 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "lr_harness.hpp"
#include "scratch.hpp"

namespace kiln::lr_test {
namespace {

constexpr double kBase = 0.4;
constexpr int64_t kMaxIters = 400;
constexpr int64_t kItersPerEpoch = 37;

struct TorchCase {
  std::string name;
  std::string component;
  std::function<void(Options&)> options;
  int64_t warm;
  std::string scheduler;  // torch.optim.lr_scheduler class
  std::string kwargs;     // its arguments besides the optimizer, as JSON
  int64_t torch_steps;    // scheduler steps the oracle runs
  std::function<int64_t(int64_t it, int64_t warm)> last_epoch;
  int64_t last_iter;  // compared for it in warm + 1 .. last_iter
};

int64_t from_start(int64_t it, int64_t) { return it - 1; }
int64_t by_epochs(int64_t it, int64_t) { return (it - 1) / kItersPerEpoch; }
int64_t pet_from_start(int64_t it, int64_t) { return it; }
int64_t pet_by_epochs(int64_t it, int64_t) { return it / kItersPerEpoch; }
int64_t after_warmup(int64_t it, int64_t warm) { return it - warm - 1; }

std::vector<TorchCase> torch_cases() {
  const int64_t epochs = kMaxIters / kItersPerEpoch + 1;
  std::vector<TorchCase> out;
  for (int64_t warm : {int64_t{0}, int64_t{25}}) {
    const std::string w = "_warm" + std::to_string(warm);
    const int64_t span = kMaxIters - warm;
    out.push_back({"step_list" + w, "step",
                   [](Options& o) {
                     o.set_int_list("steps", {30, 120, 250}).set_float("gamma", 0.1);
                   },
                   warm, "MultiStepLR", R"({"milestones": [30, 120, 250], "gamma": 0.1})",
                   kMaxIters, pet_from_start, kMaxIters});
    out.push_back({"step_size" + w, "step",
                   [](Options& o) { o.set_int("step_size", 45).set_float("gamma", 0.5); }, warm,
                   "StepLR", R"({"step_size": 45, "gamma": 0.5})", kMaxIters, from_start,
                   kMaxIters});
    out.push_back({"step_size_by_epoch" + w, "step",
                   [](Options& o) {
                     o.set_int("step_size", 3).set_float("gamma", 0.5).set_bool("by_epoch", true);
                   },
                   warm, "StepLR", R"({"step_size": 3, "gamma": 0.5})", epochs, by_epochs,
                   kMaxIters});
    // mmengine's convert_to_iter_based: the same schedule stepped per iteration.
    out.push_back({"step_size_by_epoch_as_iters" + w, "step",
                   [](Options& o) {
                     o.set_int("step_size", 3).set_float("gamma", 0.5).set_bool("by_epoch", true);
                   },
                   warm, "StepLR",
                   R"({"step_size": )" + std::to_string(3 * kItersPerEpoch) + R"(, "gamma": 0.5})",
                   kMaxIters, from_start, kMaxIters});
    out.push_back(
        {"step_list_by_epoch" + w, "step",
         [](Options& o) {
           o.set_int_list("steps", {2, 5, 9}).set_float("gamma", 0.1).set_bool("by_epoch", true);
         },
         warm, "MultiStepLR", R"({"milestones": [2, 5, 9], "gamma": 0.1})", epochs, pet_by_epochs,
         kMaxIters});
    out.push_back({"multistep" + w, "multistep",
                   [](Options& o) {
                     o.set_int_list("milestones", {50, 50, 180, 300}).set_float("gamma", 0.3);
                   },
                   warm, "MultiStepLR", R"({"milestones": [50, 50, 180, 300], "gamma": 0.3})",
                   kMaxIters, from_start, kMaxIters});
    out.push_back({"multistep_by_epoch" + w, "multistep",
                   [](Options& o) {
                     o.set_int_list("milestones", {2, 2, 6, 8})
                         .set_float("gamma", 0.3)
                         .set_bool("by_epoch", true);
                   },
                   warm, "MultiStepLR", R"({"milestones": [2, 2, 6, 8], "gamma": 0.3})", epochs,
                   by_epochs, kMaxIters});
    out.push_back({"exp" + w, "exp", [](Options& o) { o.set_float("gamma", 0.99); }, warm,
                   "ExponentialLR", R"({"gamma": 0.99})", kMaxIters, from_start, kMaxIters});
    for (double min_lr : {0.0, 0.002}) {
      std::ostringstream kwargs;
      kwargs.precision(17);
      kwargs << R"({"T_max": )" << span << R"(, "eta_min": )" << min_lr << "}";
      out.push_back({std::string(min_lr == 0.0 ? "cosine" : "cosine_min") + w, "cosine",
                     [=](Options& o) { o.set_float("min_lr", min_lr); }, warm, "CosineAnnealingLR",
                     kwargs.str(), span, after_warmup, kMaxIters});
    }
    for (double power : {0.9, 2.0}) {
      std::ostringstream kwargs;
      kwargs << R"({"total_iters": )" << span << R"(, "power": )" << power << "}";
      out.push_back({std::string(power == 0.9 ? "poly" : "poly_square") + w, "poly",
                     [=](Options& o) { o.set_float("power", power); }, warm, "PolynomialLR",
                     kwargs.str(), span + 5, after_warmup, kMaxIters + 5});
    }
    // SGDR: equal cycles, and cycles doubling in length, with a floor.
    out.push_back({"cosine_restarts" + w, "cosine_restarts",
                   [](Options& o) { o.set_int("t_0", 40).set_float("min_lr", 0.001); }, warm,
                   "CosineAnnealingWarmRestarts", R"({"T_0": 40, "T_mult": 1, "eta_min": 0.001})",
                   span, after_warmup, kMaxIters});
    out.push_back({"cosine_restarts_mult" + w, "cosine_restarts",
                   [](Options& o) { o.set_int("t_0", 30).set_int("t_mult", 2); }, warm,
                   "CosineAnnealingWarmRestarts", R"({"T_0": 30, "T_mult": 2, "eta_min": 0.0})",
                   span, after_warmup, kMaxIters});
    // OneCycleLR over the steps after warm-up (torch refuses to step past total_steps - 1).
    for (const char* anneal : {"cos", "linear"}) {
      for (bool three : {false, true}) {
        std::ostringstream kwargs;
        kwargs.precision(17);
        kwargs << R"({"max_lr": )" << kBase << R"(, "total_steps": )" << span
               << R"(, "pct_start": 0.3, "anneal_strategy": ")" << anneal
               << R"(", "div_factor": 20.0, "final_div_factor": 500.0, "three_phase": )"
               << (three ? "true" : "false") << R"(, "cycle_momentum": false})";
        const std::string a = anneal;
        out.push_back({"one_cycle_" + a + (three ? "_three" : "") + w, "one_cycle",
                       [=](Options& o) {
                         o.set_float("pct_start", 0.3)
                             .set_string("anneal_strategy", a)
                             .set_float("div_factor", 20.0)
                             .set_float("final_div_factor", 500.0)
                             .set_bool("three_phase", three);
                       },
                       warm, "OneCycleLR", kwargs.str(), span - 1, after_warmup, kMaxIters});
      }
    }
    // CyclicLR between the base lr and 1.0, rising 30 and falling 20 iterations.
    for (const char* mode : {"triangular", "triangular2", "exp_range"}) {
      std::ostringstream kwargs;
      kwargs.precision(17);
      kwargs << R"({"base_lr": )" << kBase << R"(, "max_lr": 1.0, "step_size_up": 30, )"
             << R"("step_size_down": 20, "mode": ")" << mode
             << R"(", "gamma": 0.995, "cycle_momentum": false})";
      const std::string m = mode;
      out.push_back({"cyclic_" + m + w, "cyclic",
                     [=](Options& o) {
                       o.set_float("max_lr", 1.0)
                           .set_int("step_size_up", 30)
                           .set_int("step_size_down", 20)
                           .set_string("mode", m)
                           .set_float("gamma", 0.995);
                     },
                     warm, "CyclicLR", kwargs.str(), span, after_warmup, kMaxIters});
    }
    out.push_back({"linear" + w, "linear",
                   [](Options& o) {
                     o.set_float("start_factor", 0.25)
                         .set_float("end_factor", 0.9)
                         .set_int("total_iters", 60);
                   },
                   warm, "LinearLR",
                   R"({"start_factor": 0.25, "end_factor": 0.9, "total_iters": 60})", span + 5,
                   after_warmup, kMaxIters + 5});
  }
  return out;
}

TEST(TorchSchedulers, EveryIterationMatches) {
  const std::vector<TorchCase> cases = torch_cases();
  std::ostringstream json;
  json.precision(17);
  json << R"({"cases": [)";
  for (size_t i = 0; i < cases.size(); ++i) {
    const TorchCase& c = cases[i];
    json << (i ? ", " : "") << R"({"name": ")" << c.name << R"(", "scheduler": ")" << c.scheduler
         << R"(", "kwargs": )" << c.kwargs << R"(, "base_lr": )" << kBase << R"(, "steps": )"
         << c.torch_steps << "}";
  }
  json << "]}";
  kiln::test::Scratch oracle;
  oracle.write_text("config.json", json.str());
  oracle.run("lr_schedulers.py");

  for (const TorchCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<double> torch_lr =
        oracle.read_doubles(c.name + ".bin", static_cast<size_t>(c.torch_steps + 1));
    Options options;
    c.options(options);
    Policy policy(c.component);
    Status status = policy.create(options, make_schedule(kBase, kMaxIters, c.warm, kItersPerEpoch));
    ASSERT_EQ(status, nullptr) << describe(status.get());
    double worst = 0.0;
    for (int64_t it = c.warm + 1; it <= c.last_iter; ++it) {
      const int64_t e = c.last_epoch(it, c.warm);
      ASSERT_GE(e, 0);
      ASSERT_LE(e, c.torch_steps);
      const double expected = torch_lr[static_cast<size_t>(e)];
      const double got = policy.at(it);
      ASSERT_NEAR(got, expected, 1e-9 * kBase)
          << "iter " << it << " (torch last_epoch " << e << ")";
      worst = std::max(worst, std::fabs(got - expected));
    }
    std::printf("%-34s vs %-18s max |kiln - torch| = %.3g\n", c.name.c_str(), c.scheduler.c_str(),
                worst);
  }
}

}  // namespace
}  // namespace kiln::lr_test
