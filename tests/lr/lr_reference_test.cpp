// Every policy with every warm-up, as the host runs it (pipeline → schedule_frame → the plugin →
// lr_at), at every iteration of a run, against the reference its documentation names
// (docs/config.md): PyTorch's schedulers stepped as in training, or Pet's get_lr
// (tests/oracle/lr_reference.py). The run has 110 micro-batches an epoch in windows of 3: 37
// iterations an epoch, 11 epochs, 407 iterations; warm-up is given in iterations and in epochs.
//
// How each kiln set-up maps onto its reference (step k of the run trains at lr_at(k); a torch
// scheduler stepped once per iteration trains step k at last_epoch = k − 1):
//  - constant, step with `steps`: Pet's get_lr (STEP, no steps for constant);
//  - step with `step_size`, multistep: StepLR / MultiStepLR from the start of the run, stepped per
//    iteration or, with by_epoch, per epoch; after a torch warm-up that ends before the first
//    decay this is ChainedScheduler([warm-up, scheduler]);
//  - exp: ExponentialLR from the start of the run, the warm-up's rates replacing its first W;
//  - cosine, poly: Pet's COSINE / POLY, and CosineAnnealingLR / PolynomialLR after the warm-up
//    (SequentialLR with milestone W);
//  - warm-up: constant = ConstantLR(factor, W) = Pet's CONSTANT; linear = Pet's LINEAR;
//    torch_linear = LinearLR(start_factor = factor, total_iters = W).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/lr_driver.hpp"
#include "kiln_test_paths.h"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "scratch.hpp"

namespace {

constexpr double kBase = 0.4;
constexpr double kFactor = 0.2;
constexpr int64_t kBatches = 110, kAccumulation = 3, kEpochs = 11;
constexpr int64_t kPerEpoch = 37;  // ceil(110 / 3): the last window of an epoch has 2 batches
constexpr int64_t kIters = kEpochs * kPerEpoch;

const kiln::plugin::Registry& registry() {
  static kiln::plugin::Registry r = [] {
    kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
    std::vector<std::string> refused;
    return kiln::plugin::load_all(loader, {KILN_PLUGIN_DIR}, refused);
  }();
  return r;
}

std::string num(double v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

// A warm-up as the pipeline gives it and the number of iterations it must come to.
struct Warm {
  std::string name;  // "none", "constant", "linear", "torch_linear"
  std::string keys;  // its [lr_policy] keys
  int64_t iters;     // W
};

std::vector<Warm> warmups() {
  return {{"none", "warmup = \"none\"", 0},
          {"constant", "warmup = \"constant\"\nwarmup_iters = 25", 25},
          // round(0.5 × 37 = 18.5): halves away from zero.
          {"linear", "warmup = \"linear\"\nwarmup_epochs = 0.5", 19},
          {"torch_linear", "warmup = \"torch_linear\"\nwarmup_epochs = 0.7", 26}};
}

// --- reference programs (tests/oracle/lr_reference.py) ---

std::string torch_spec(const std::string& cls, const std::string& kwargs) {
  return R"({"class": ")" + cls + R"(", "kwargs": )" + kwargs + "}";
}
std::string torch_program(const std::string& spec, int64_t every = 1) {
  return R"({"torch": )" + spec + R"(, "every": )" + std::to_string(every) + "}";
}
// The warm-up's torch scheduler (constant and torch_linear).
std::string torch_warmup(const Warm& w) {
  return w.name == "constant"
             ? torch_spec("ConstantLR", R"({"factor": )" + num(kFactor) + R"(, "total_iters": )" +
                                            std::to_string(w.iters) + "}")
             : torch_spec("LinearLR", R"({"start_factor": )" + num(kFactor) +
                                          R"(, "total_iters": )" + std::to_string(w.iters) + "}");
}
// Pet's get_lr: `policy_keys` are the policy's fields; the warm-up is Pet's method of `w`.
std::string pet_program(const std::string& policy_keys, const Warm& w, bool with_warmup) {
  const std::string method = !with_warmup || w.name == "none" ? "NONE"
                             : w.name == "constant"           ? "CONSTANT"
                                                              : "LINEAR";
  return R"({"pet": {)" + policy_keys + R"(, "max_iter": )" + std::to_string(kIters) +
         R"(, "warm_up_method": ")" + method + R"(", "warm_up_iters": )" + std::to_string(w.iters) +
         R"(, "warm_up_factor": )" + num(kFactor) + "}}";
}
// The warm-up's own reference, for splicing: torch's scheduler, or Pet's LINEAR.
std::string warmup_program(const Warm& w) {
  return w.name == "linear" ? pet_program(R"("policy": "STEP", "steps": [], "gamma": 1)", w, true)
                            : torch_program(torch_warmup(w));
}
std::string splice(const Warm& w, const std::string& main, bool restart) {
  return R"({"splice": )" + std::to_string(w.iters) + R"(, "warmup": )" + warmup_program(w) +
         R"(, "main": )" + main + R"(, "restart": )" + (restart ? "true" : "false") + "}";
}

struct Case {
  std::string name;
  std::string policy;  // [lr_policy] keys of the policy
  Warm warm;
  std::string program;  // its reference
};

// A Pet-named policy: Pet's get_lr, or after torch's LinearLR the same policy spliced in.
void add_pet(std::vector<Case>& out, const std::string& name, const std::string& policy,
             const std::string& pet_keys) {
  for (const Warm& w : warmups()) {
    const std::string program = w.name == "torch_linear"
                                    ? splice(w, pet_program(pet_keys, w, false), false)
                                    : pet_program(pet_keys, w, true);
    out.push_back({name + "_pet_" + w.name, policy, w, program});
  }
}

// A torch scheduler counting from the start of the run, stepped every `every` iterations.
// `chained`: after a torch warm-up the composition is ChainedScheduler (the scheduler does not
// decay during the warm-up); else the warm-up's rates are spliced in.
void add_torch_from_start(std::vector<Case>& out, const std::string& name,
                          const std::string& policy, const std::string& spec, int64_t every,
                          bool chained) {
  for (const Warm& w : warmups()) {
    std::string program;
    if (w.name == "none") {
      program = torch_program(spec, every);
    } else if (chained && w.name != "linear") {
      program = torch_program(R"({"class": "ChainedScheduler", "schedulers": [)" + torch_warmup(w) +
                              ", " + spec + "]}");
    } else {
      program = splice(w, torch_program(spec, every), false);
    }
    out.push_back({name + "_torch_" + w.name, policy, w, program});
  }
}

// A torch scheduler over the iterations after warm-up: `spec_for(span)` with span = max − W.
template <typename SpecFor>
void add_torch_after_warmup(std::vector<Case>& out, const std::string& name,
                            const std::string& policy, SpecFor spec_for) {
  for (const Warm& w : warmups()) {
    const std::string main = spec_for(kIters - w.iters);
    std::string program;
    if (w.name == "none") {
      program = torch_program(main);
    } else if (w.name == "linear") {
      program = splice(w, torch_program(main), true);
    } else {
      program =
          torch_program(R"({"class": "SequentialLR", "schedulers": [)" + torch_warmup(w) + ", " +
                        main + R"(], "milestones": [)" + std::to_string(w.iters) + "]}");
    }
    out.push_back({name + "_torch_" + w.name, policy, w, program});
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  add_pet(out, "constant", "name = \"constant\"", R"("policy": "STEP", "steps": [], "gamma": 1)");
  add_pet(out, "step_list", "name = \"step\"\nsteps = [60, 150, 300]\ngamma = 0.1",
          R"("policy": "STEP", "steps": [60, 150, 300], "gamma": 0.1)");
  add_pet(out, "step_list_by_epoch",
          "name = \"step\"\nsteps = [2, 5, 9]\ngamma = 0.1\nby_epoch = true",
          R"("policy": "STEP", "steps": [74, 185, 333], "gamma": 0.1)");
  add_pet(out, "cosine", "name = \"cosine\"", R"("policy": "COSINE")");
  add_pet(out, "poly", "name = \"poly\"\npower = 0.9", R"("policy": "POLY", "power": 0.9)");
  add_pet(out, "poly_square", "name = \"poly\"\npower = 2.0", R"("policy": "POLY", "power": 2.0)");

  add_torch_from_start(out, "step_size", "name = \"step\"\nstep_size = 45\ngamma = 0.5",
                       torch_spec("StepLR", R"({"step_size": 45, "gamma": 0.5})"), 1, true);
  add_torch_from_start(out, "step_size_by_epoch",
                       "name = \"step\"\nstep_size = 3\ngamma = 0.5\nby_epoch = true",
                       torch_spec("StepLR", R"({"step_size": 3, "gamma": 0.5})"), kPerEpoch, false);
  add_torch_from_start(
      out, "multistep", "name = \"multistep\"\nmilestones = [50, 50, 180, 300]\ngamma = 0.3",
      torch_spec("MultiStepLR", R"({"milestones": [50, 50, 180, 300], "gamma": 0.3})"), 1, true);
  add_torch_from_start(
      out, "multistep_by_epoch",
      "name = \"multistep\"\nmilestones = [2, 2, 6, 8]\ngamma = 0.3\nby_epoch = true",
      torch_spec("MultiStepLR", R"({"milestones": [2, 2, 6, 8], "gamma": 0.3})"), kPerEpoch, false);
  add_torch_from_start(out, "exp", "name = \"exp\"\ngamma = 0.99",
                       torch_spec("ExponentialLR", R"({"gamma": 0.99})"), 1, false);

  for (double min_lr : {0.0, 0.002}) {
    add_torch_after_warmup(out, min_lr == 0.0 ? "cosine" : "cosine_min",
                           "name = \"cosine\"\nmin_lr = " + num(min_lr), [=](int64_t span) {
                             return torch_spec("CosineAnnealingLR",
                                               R"({"T_max": )" + std::to_string(span) +
                                                   R"(, "eta_min": )" + num(min_lr) + "}");
                           });
  }
  for (double power : {0.9, 2.0}) {
    add_torch_after_warmup(out, power == 0.9 ? "poly" : "poly_square",
                           "name = \"poly\"\npower = " + num(power), [=](int64_t span) {
                             return torch_spec("PolynomialLR",
                                               R"({"total_iters": )" + std::to_string(span) +
                                                   R"(, "power": )" + num(power) + "}");
                           });
  }
  return out;
}

TEST(LrReference, EveryPolicyWithEveryWarmupEqualsItsReferenceAtEveryIteration) {
  const std::vector<Case> all = cases();
  std::string json = R"({"cases": [)";
  for (size_t i = 0; i < all.size(); ++i) {
    json += std::string(i ? ", " : "") + R"({"name": ")" + all[i].name + R"(", "base_lr": )" +
            num(kBase) + R"(, "iters": )" + std::to_string(kIters) + R"(, "program": )" +
            all[i].program + "}";
  }
  json += "]}";
  kiln::test::Scratch oracle;
  oracle.write_text("config.json", json);
  oracle.run("lr_reference.py");

  for (const Case& c : all) {
    SCOPED_TRACE(c.name);
    const std::string text =
        "[model]\nname = \"mlp\"\n[data]\nbatch_size = 64\n[optimizer]\nlr = " + num(kBase) +
        "\n[run]\nepochs = " + std::to_string(kEpochs) +
        "\naccumulation_steps = " + std::to_string(kAccumulation) + "\n[lr_policy]\n" + c.policy +
        "\n" + c.warm.keys + "\nwarmup_factor = " + num(kFactor) + "\n";
    const kiln::config::Pipeline p =
        kiln::config::load_pipeline_text(text, "reference.toml", {}, registry());
    const kiln::engine::ScheduleFrame frame = kiln::engine::schedule_frame(p, kBatches);
    ASSERT_EQ(frame.iters_per_epoch, kPerEpoch);
    ASSERT_EQ(frame.max_iters, kIters);
    ASSERT_EQ(frame.warmup_iters, c.warm.iters);
    kiln::plugin::LrPolicyAdapter policy(*p.lr_policy.component, p.lr_policy.options,
                                         kiln::engine::to_policy_schedule(frame));
    const std::vector<double> reference =
        oracle.read_doubles(c.name + ".bin", static_cast<size_t>(kIters));
    double worst = 0.0;
    for (int64_t k = 1; k <= kIters; ++k) {
      const double expected = reference[static_cast<size_t>(k - 1)];
      const double got = kiln::engine::lr_at(frame, policy, k);
      ASSERT_NEAR(got, expected, 1e-12 * kBase) << "iteration " << k;
      worst = std::max(worst, std::fabs(got - expected));
    }
    std::printf("%-36s max |kiln - reference| = %.3g\n", c.name.c_str(), worst);
  }
}

}  // namespace
