// The host's side of LR scheduling: Pet's warm-up (checked against torch's LinearLR/ConstantLR),
// warm-up in epochs, linear batch scaling, counting applied or attempted steps, the change log,
// and the refusal of two warm-up lengths.
#include "engine/lr_driver.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>

#include "kiln_test_paths.h"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"

namespace {

using kiln::engine::LrDriver;
using kiln::engine::ScheduleFrame;

const kiln::plugin::Registry& registry() {
  static kiln::plugin::Registry r = [] {
    kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
    std::vector<std::string> refused;
    return kiln::plugin::load_all(loader, {KILN_PLUGIN_DIR}, refused);
  }();
  return r;
}

kiln::config::Pipeline pipeline(const std::string& lr_policy, const std::string& extra = "") {
  const std::string text =
      "[model]\nname = \"mlp\"\n[data]\nbatch_size = 64\n[optimizer]\nlr = 0.4\n"
      "[lr_policy]\n" +
      lr_policy + "\n" + extra;
  return kiln::config::load_pipeline_text(text, "test.toml", {}, registry());
}

struct Schedule {
  ScheduleFrame frame;
  std::unique_ptr<kiln::plugin::LrPolicyAdapter> policy;
};

Schedule schedule(const kiln::config::Pipeline& p, int64_t iters_per_epoch) {
  Schedule s;
  s.frame = kiln::engine::schedule_frame(p, iters_per_epoch);
  s.policy = std::make_unique<kiln::plugin::LrPolicyAdapter>(
      *p.lr_policy.component, p.lr_policy.options, kiln::engine::to_policy_schedule(s.frame));
  return s;
}

// torch's scheduler values after k = 0..n steps (one Python process).
std::vector<double> torch_values(const std::string& scheduler, int n) {
  std::string command = std::string(KILN_TEST_PYTHON) +
                        " -c \"import torch\n"
                        "p = torch.nn.Parameter(torch.zeros(1))\n"
                        "o = torch.optim.SGD([p], lr=0.4)\n"
                        "s = torch.optim.lr_scheduler." +
                        scheduler +
                        "\n"
                        "v = [o.param_groups[0]['lr']]\n"
                        "for _ in range(" +
                        std::to_string(n) +
                        "):\n"
                        "    o.step(); s.step(); v.append(o.param_groups[0]['lr'])\n"
                        "print(' '.join(repr(x) for x in v))\"";
  FILE* pipe = popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  while (size_t got = fread(buffer, 1, sizeof(buffer), pipe)) out.append(buffer, got);
  EXPECT_EQ(pclose(pipe), 0);
  std::istringstream in(out);
  std::vector<double> values;
  for (double v; in >> v;) values.push_back(v);
  return values;
}

TEST(LrDriver, LinearWarmupIsPetsFormulaAndTorchsLinearLR) {
  auto p =
      pipeline("name = \"constant\"\nwarmup = \"linear\"\nwarmup_iters = 20\nwarmup_factor = 0.25");
  Schedule s = schedule(p, 100);
  auto torch = torch_values("LinearLR(o, start_factor=0.25, total_iters=20)", 40);
  ASSERT_EQ(torch.size(), 41u);
  // Pet's warm-up is LinearLR with start_factor F + (1 − F)/W over W − 1, stepped as in training.
  auto shifted = torch_values("LinearLR(o, start_factor=0.25 + 0.75 / 20, total_iters=19)", 40);
  ASSERT_EQ(shifted.size(), 41u);
  for (int it = 1; it <= 40; ++it) {
    EXPECT_NEAR(kiln::engine::lr_at(s.frame, *s.policy, it), shifted[it - 1], 1e-12) << it;
    const double alpha = std::min(1.0, it / 20.0);
    const double pet = it <= 20 ? 0.4 * (0.25 * (1 - alpha) + alpha) : 0.4;
    const double kiln = kiln::engine::lr_at(s.frame, *s.policy, it);
    EXPECT_NEAR(kiln, pet, 1e-12) << it;
    EXPECT_NEAR(kiln, torch[it], 1e-9) << it;  // LinearLR after `it` steps
  }
}

TEST(LrDriver, TorchLinearWarmupIsTorchsLinearLR) {
  auto p = pipeline(
      "name = \"constant\"\nwarmup = \"torch_linear\"\nwarmup_iters = 20\nwarmup_factor = 0.25");
  Schedule s = schedule(p, 100);
  auto torch = torch_values("LinearLR(o, start_factor=0.25, total_iters=20)", 40);
  ASSERT_EQ(torch.size(), 41u);
  for (int it = 1; it <= 40; ++it) {
    // The it-th optimizer step trains at last_epoch = it − 1: 0.25·lr first, lr from 21 on.
    EXPECT_NEAR(kiln::engine::lr_at(s.frame, *s.policy, it), torch[it - 1], 1e-12) << it;
  }
}

TEST(LrDriver, ConstantWarmupIsPetsFormulaAndTorchsConstantLR) {
  auto p = pipeline(
      "name = \"constant\"\nwarmup = \"constant\"\nwarmup_iters = 10\nwarmup_factor = 0.1");
  Schedule s = schedule(p, 100);
  auto torch = torch_values("ConstantLR(o, factor=0.1, total_iters=10)", 30);
  for (int it = 1; it <= 30; ++it) {
    const double kiln = kiln::engine::lr_at(s.frame, *s.policy, it);
    EXPECT_NEAR(kiln, it <= 10 ? 0.04 : 0.4, 1e-12) << it;
    EXPECT_NEAR(kiln, torch[it - 1], 1e-9) << it;  // Pet warms through iteration W inclusive
  }
}

TEST(LrDriver, WarmupInEpochsConvertsWithTheLoaderLength) {
  auto p = pipeline("name = \"constant\"\nwarmup = \"linear\"\nwarmup_epochs = 0.5");
  EXPECT_EQ(kiln::engine::schedule_frame(p, 37).warmup_iters, 19);  // round(18.5)
  EXPECT_EQ(kiln::engine::schedule_frame(p, 40).warmup_iters, 20);
}

TEST(LrDriver, BothWarmupLengthsAreRefused) {
  auto p =
      pipeline("name = \"constant\"\nwarmup = \"linear\"\nwarmup_epochs = 1.0\nwarmup_iters = 5");
  try {
    kiln::engine::schedule_frame(p, 10);
    ADD_FAILURE() << "accepted both";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(
        e.what(),
        "lr_policy.warmup_iters and lr_policy.warmup_epochs are both set; give one of them");
  }
}

TEST(LrDriver, LinearScalingUsesTheEffectiveBatch) {
  auto p = pipeline("name = \"constant\"", "[lr_scaling]\nbase_batch = 256\n");
  ScheduleFrame f = kiln::engine::schedule_frame(p, 10);
  EXPECT_EQ(f.effective_batch, 64);
  EXPECT_DOUBLE_EQ(f.base_lr, 0.1);  // 0.4 × 64 / 256
  Schedule s = schedule(p, 10);
  EXPECT_DOUBLE_EQ(kiln::engine::lr_at(s.frame, *s.policy, 3), 0.1);
  // data.batch_size is the global batch: accumulation multiplies it, the world size does not.
  auto accumulated = pipeline("name = \"constant\"",
                              "[lr_scaling]\nbase_batch = 256\n[run]\naccumulation_steps = 4\n");
  ScheduleFrame f2 = kiln::engine::schedule_frame(accumulated, 10);
  EXPECT_EQ(f2.effective_batch, 256);
  EXPECT_DOUBLE_EQ(f2.base_lr, 0.4);
}

// The frame counts optimizer steps: an epoch of 10 micro-batches in windows of 4 is 3 steps
// (4, 4, 2), and warm-up and milestones in epochs convert with that.
TEST(LrDriver, EpochsAreOptimizerStepsUnderAccumulation) {
  auto p = pipeline(
      "name = \"multistep\"\nmilestones = [2]\nby_epoch = true\nwarmup = \"linear\"\n"
      "warmup_epochs = 1.5",
      "[run]\nepochs = 4\naccumulation_steps = 4\n");
  Schedule s = schedule(p, 10);
  EXPECT_EQ(s.frame.batches_per_epoch, 10);
  EXPECT_EQ(s.frame.iters_per_epoch, 3);
  EXPECT_EQ(s.frame.max_iters, 12);
  EXPECT_EQ(s.frame.warmup_iters, 5);  // round(4.5)
  EXPECT_DOUBLE_EQ(kiln::engine::lr_at(s.frame, *s.policy, 6), 0.4);
  EXPECT_DOUBLE_EQ(kiln::engine::lr_at(s.frame, *s.policy, 7), 0.04);  // epoch 3's first
  EXPECT_EQ(kiln::engine::steps_per_epoch(12, 4), 3);
  EXPECT_EQ(kiln::engine::steps_per_epoch(13, 4), 4);
}

TEST(LrDriver, CountsAppliedOrAttemptedSteps) {
  const std::vector<bool> applied = {true, false, true, false, true, true};
  for (const std::string count : {"applied", "attempted"}) {
    auto p = pipeline("name = \"step\"\nsteps = [2, 4]\ngamma = 0.5\ncount = \"" + count + "\"");
    Schedule s = schedule(p, 100);
    LrDriver driver(s.frame, *s.policy);
    std::vector<double> seen;
    for (bool a : applied) {
      seen.push_back(driver.current());
      driver.advance(a);
    }
    // Iterations used: applied → 1,2,2,3,3,4 ; attempted → 1..6.
    const std::vector<int> iters = count == "applied" ? std::vector<int>{1, 2, 2, 3, 3, 4}
                                                      : std::vector<int>{1, 2, 3, 4, 5, 6};
    for (size_t i = 0; i < iters.size(); ++i) {
      EXPECT_DOUBLE_EQ(seen[i], kiln::engine::lr_at(s.frame, *s.policy, iters[i])) << count << i;
    }
    EXPECT_EQ(driver.counted(), count == "applied" ? 4 : 6);
  }
}

// The lines a run logs about its lr: `applied` says which steps were applied (a skipped one is
// not counted under count = "applied").
std::vector<std::string> change_notes(const std::string& lr_policy, int64_t iters_per_epoch,
                                      const std::vector<bool>& applied) {
  auto p = pipeline(lr_policy, "[run]\nepochs = 1\n");
  Schedule s = schedule(p, iters_per_epoch);
  LrDriver driver(s.frame, *s.policy);
  std::vector<std::string> notes;
  for (size_t step = 1; step <= applied.size(); ++step) {
    const double lr = driver.current();
    driver.advance(applied[step - 1]);
    const std::string note = driver.change_note(lr);
    if (!note.empty()) notes.push_back("step " + std::to_string(step) + ": " + note);
  }
  return notes;
}

using Notes = std::vector<std::string>;

TEST(LrChangeLog, WarmupLogsItsStartAndEndOnly) {
  // Linear warm-up over 20 of 100 steps, then a cosine to 0: per-step ratios above 1.1 in the
  // warm-up's first 9 steps and in the cosine's last 19 (0.0585786 / 0.0531355 = 1.102 at 82).
  // Before, each of the tail's steps logged a line, and the warm-up a line on most of its steps.
  const Notes notes = change_notes("name = \"cosine\"\nwarmup = \"linear\"\nwarmup_iters = 20", 100,
                                   std::vector<bool>(100, true));
  EXPECT_EQ(notes, (Notes{"step 1: lr 0.058 (linear warm-up to 0.4 over 20 steps)",
                          "step 21: lr 0.4: warm-up done", "step 82: lr 0.0585786 -> 0.0531355"}));
}

TEST(LrChangeLog, MilestonesAreLoggedAndSmoothDecayIsNot) {
  EXPECT_EQ(change_notes("name = \"multistep\"\nmilestones = [30, 60]", 100,
                         std::vector<bool>(100, true)),
            (Notes{"step 1: lr 0.4", "step 31: lr 0.4 -> 0.04", "step 61: lr 0.04 -> 0.004"}));
  // 0.95 a step (under the ratio): the progress lines show it; nothing here.
  EXPECT_EQ(change_notes("name = \"exp\"\ngamma = 0.95", 100, std::vector<bool>(100, true)),
            (Notes{"step 1: lr 0.4"}));
  // 0.5 a step: every step is above the ratio; the run of them logs once.
  EXPECT_EQ(change_notes("name = \"exp\"\ngamma = 0.5", 100, std::vector<bool>(100, true)),
            (Notes{"step 1: lr 0.4", "step 2: lr 0.4 -> 0.2"}));
  EXPECT_TRUE(change_notes("name = \"multistep\"\nmilestones = [30]\nlog_change_ratio = 0", 100,
                           std::vector<bool>(100, true))
                  .empty());
}

TEST(LrChangeLog, ASkippedStepRepeatsItsIterationQuietly) {
  // Steps 2 and 3 skipped under count = "applied": iterations 1, 2, 2, 2, 3, ...; the
  // milestone after iteration 3 is reached at step 6.
  std::vector<bool> applied(10, true);
  applied[1] = applied[2] = false;
  EXPECT_EQ(change_notes("name = \"multistep\"\nmilestones = [3]", 100, applied),
            (Notes{"step 1: lr 0.4", "step 6: lr 0.4 -> 0.04"}));
}

}  // namespace

namespace {

// Every policy with every warm-up, through the host's driver, at every iteration of a
// 100-iteration run, against the closed forms (Pet's for warm-up, cosine and poly).
TEST(LrDriver, EveryPolicyWithEveryWarmupMatchesTheClosedForm) {
  const double base = 0.4, factor = 0.2, min_lr = 0.01;
  const int64_t n = 100, w = 10;
  auto bisect_right = [](const std::vector<int64_t>& xs, int64_t it) {
    return static_cast<double>(std::upper_bound(xs.begin(), xs.end(), it) - xs.begin());
  };
  const std::vector<std::pair<std::string, std::function<double(int64_t, int64_t)>>> policies = {
      {"name = \"constant\"", [&](int64_t, int64_t) { return base; }},
      {"name = \"step\"\nsteps = [30, 60]\ngamma = 0.1",
       [&](int64_t it, int64_t) {
         return base * std::pow(0.1, bisect_right({30, 60}, it));
       }},
      // StepLR and MultiStepLR: iteration it trains at torch's last_epoch = it − 1.
      {"name = \"step\"\nstep_size = 25\ngamma = 0.5",
       [&](int64_t it, int64_t) {
         return base * std::pow(0.5, static_cast<double>((it - 1) / 25));
       }},
      {"name = \"multistep\"\nmilestones = [40, 80]\ngamma = 0.3",
       [&](int64_t it, int64_t) {
         return base * std::pow(0.3, bisect_right({40, 80}, it - 1));
       }},
      {"name = \"cosine\"\nmin_lr = 0.01",
       [&](int64_t it, int64_t warm) {
         return min_lr + (base - min_lr) * 0.5 *
                             (1 + std::cos(M_PI * static_cast<double>(it - warm - 1) /
                                           static_cast<double>(n - warm)));
       }},
      {"name = \"poly\"\npower = 0.9",
       [&](int64_t it, int64_t warm) {
         return base * std::pow(std::max(0.0, 1.0 - static_cast<double>(it - warm - 1) /
                                                        static_cast<double>(n - warm)),
                                0.9);
       }},
      {"name = \"exp\"\ngamma = 0.98",
       [&](int64_t it, int64_t) { return base * std::pow(0.98, static_cast<double>(it - 1)); }},
  };
  for (const auto& [policy, closed] : policies) {
    for (const std::string warmup : {"none", "constant", "linear", "torch_linear"}) {
      const std::string text = policy + "\nwarmup = \"" + warmup + "\"\nwarmup_iters = " +
                               (warmup == "none" ? "0" : std::to_string(w)) +
                               "\nwarmup_factor = 0.2";
      auto p = pipeline(text, "[run]\nepochs = 1\n");
      Schedule s = schedule(p, n);
      const int64_t warm = warmup == "none" ? 0 : w;
      for (int64_t it = 1; it <= n; ++it) {
        double expect = 0.0;
        if (it <= warm && warmup == "constant") {
          expect = base * factor;
        } else if (it <= warm) {
          // Pet's LINEAR reaches the base at W; torch's LinearLR at W + 1.
          const double alpha =
              static_cast<double>(warmup == "linear" ? it : it - 1) / static_cast<double>(w);
          expect = base * (factor * (1 - alpha) + alpha);
        } else {
          expect = closed(it, warm);
        }
        ASSERT_NEAR(kiln::engine::lr_at(s.frame, *s.policy, it), expect, 1e-12)
            << policy << " / " << warmup << " at " << it;
      }
    }
  }
}

}  // namespace
