// Data-parallel training through the `kiln` binary, checked against PyTorch's own
// DistributedDataParallel (tests/oracle/ddp_train.py: Gloo, the same data, initial weights,
// buckets and optimizer) and against a single process on the global batch:
// - 2 ranks × B equal PyTorch DDP and 1 rank × 2B to 1e-5 after 20 steps;
// - accumulation K under DDP (no all-reduce before a window's last micro-step) equals PyTorch's
//   no_sync() loop and 1 rank × K·2B;
// - all-reduces per optimizer step equal the bucket count with accumulation, K times it with
//   sync_every_micro_step;
// - evaluation is all-reduced (same accuracy and loss as one process);
// - a global batch that the world size does not divide is refused;
// - a rank killed or hung makes `kiln launch` fail within the timeout, naming it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "ddp_fixture.hpp"

namespace {

using namespace kiln::test::ddp;

constexpr double kTolerance = 1e-5;

TEST_F(Ddp, TwoRanksMatchPyTorchDdpAndOneRankOnTheGlobalBatch) {
  pipeline("two", 32, 1, 20);
  pipeline("one", 32, 1, 20);
  Result two = run("two", 2);
  ASSERT_EQ(two.code, 0) << two.output;
  Result one = run("one", 0);
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_LT(max_diff(weights("two", 20), oracle(2, 32, 1, 20)), kTolerance);
  EXPECT_LT(max_diff(weights("two", 20), weights("one", 20)), kTolerance);
  // Rank 0 alone logs progress; both ranks' lines carry their rank.
  EXPECT_NE(two.output.find("[rank 0] "), std::string::npos) << two.output;
  EXPECT_FALSE(std::regex_search(two.output, std::regex(R"(\[rank 1\] \[[0-9:]+\] info)")))
      << two.output;
  EXPECT_EQ(two.output.find("info epoch 1/1  step 20/20"),
            two.output.rfind("info epoch 1/1  step 20/20"))
      << "progress logged by more than one rank:\n"
      << two.output;
  // run.grad_check = "auto": data-parallel ranks check every step's (all-reduced) gradients;
  // the one-process fp32 run only its logged steps (log_interval 50: the last one, 20).
  const std::vector<std::string> norms_two = grad_norms("two"), norms_one = grad_norms("one");
  ASSERT_EQ(norms_two.size(), 20u);
  ASSERT_EQ(norms_one.size(), 20u);
  for (size_t i = 0; i < norms_two.size(); ++i) {
    EXPECT_NE(norms_two[i], "null") << "step " << i + 1;
    EXPECT_EQ(norms_one[i] != "null", i + 1 == 20) << "step " << i + 1;
  }
  // Evaluation over both shards equals evaluation in one process.
  const std::regex eval(R"("accuracy":([0-9.e-]+),"loss":([0-9.e-]+))");
  std::smatch a, b;
  const std::string ea = last_eval("two"), eb = last_eval("one");
  ASSERT_TRUE(std::regex_search(ea, a, eval)) << ea;
  ASSERT_TRUE(std::regex_search(eb, b, eval)) << eb;
  EXPECT_DOUBLE_EQ(std::stod(a[1]), std::stod(b[1]));
  EXPECT_NEAR(std::stod(a[2]), std::stod(b[2]), 1e-5);
}

TEST_F(Ddp, AccumulationSkipsAllReducesAndMatchesNoSync) {
  // 2 ranks × 4 micro-batches of 8 = one step of 64: PyTorch with no_sync(), and one process.
  pipeline("acc", 16, 4, 8);
  pipeline("every", 16, 4, 8, "sync_every_micro_step = true\n");
  pipeline("plain", 16, 1, 8);
  pipeline("big", 64, 1, 8);
  for (const char* name : {"acc", "every", "plain"}) {
    Result r = run(name, 2);
    ASSERT_EQ(r.code, 0) << name << ":\n" << r.output;
  }
  Result big = run("big", 0);
  ASSERT_EQ(big.code, 0) << big.output;
  EXPECT_LT(max_diff(weights("acc", 8), oracle(2, 16, 4, 8)), kTolerance);
  EXPECT_LT(max_diff(weights("acc", 8), weights("big", 8)), kTolerance);
  EXPECT_LT(max_diff(weights("every", 8), weights("acc", 8)), kTolerance);

  // Without accumulation every step all-reduces each bucket once: that count is the bucket
  // count. Accumulation must not multiply it; sync_every_micro_step does, by 4. As in PyTorch's
  // DDP, the first step runs with a single bucket and the buckets are rebuilt after it.
  const std::vector<long> plain = allreduces("plain"), acc = allreduces("acc"),
                          every = allreduces("every");
  ASSERT_EQ(plain.size(), 8u);
  ASSERT_EQ(acc.size(), 8u);
  ASSERT_EQ(every.size(), 8u);
  EXPECT_EQ(plain[0], 1);
  EXPECT_EQ(acc[0], 1);
  for (size_t i = 1; i < plain.size(); ++i) {
    EXPECT_GT(plain[i], 1) << "step " << i + 1 << ": expected several buckets";
    EXPECT_EQ(acc[i], plain[i]) << "step " << i + 1;
    EXPECT_EQ(every[i], 4 * plain[i]) << "step " << i + 1;
  }
}

// SAM's re-evaluation under data parallelism and accumulation: each rank runs its own window's
// micro-batches again at the perturbed weights, the gradients all-reduced as in the first pass,
// so 2 ranks x 4 micro-batches of 8 take the steps of one process on batches of 64 (the ascent
// uses the global gradient's norm on every rank).
TEST_F(Ddp, SamReevaluatesEachRanksWindowAndMatchesOneProcess) {
  const std::string sam =
      "name = \"sam\"\nlr = 0.05\nrho = 0.05\n[optimizer.inner]\n"
      "name = \"sgd\"\nmomentum = 0.9\n";
  pipeline("sam_acc", 16, 4, 8, "", sam);
  pipeline("sam_big", 64, 1, 8, "", sam);
  Result acc = run("sam_acc", 2);
  ASSERT_EQ(acc.code, 0) << acc.output;
  Result big = run("sam_big", 0);
  ASSERT_EQ(big.code, 0) << big.output;
  EXPECT_LT(max_diff(weights("sam_acc", 8), weights("sam_big", 8)), kTolerance);
  // One extra pass per step, in the metrics; each all-reduces its gradients again.
  std::ifstream in(scratch_.path("sam_acc.jsonl"));
  int steps = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"type\":\"step\"") == std::string::npos) continue;
    ++steps;
    EXPECT_NE(line.find("\"reevaluations\":1"), std::string::npos) << line;
  }
  EXPECT_EQ(steps, 8);
}

// ReduceLROnPlateau (lr_policy "plateau") under data parallelism: every rank observes the
// evaluation all-reduced over both shards, so both keep the same rate, and the run equals one
// process on the global batch, the rate halved at the same steps (after the stalled
// evaluations of steps 40 and 60: a threshold no evaluation reaches, patience 0).
TEST_F(Ddp, PlateauSeesTheAllReducedEvaluationOnEveryRank) {
  const auto plateau = [&](const std::string& name) {
    pipeline(name, 32, 1, 0);
    std::string text = scratch_.read_text(name + ".toml");
    const std::string epochs = "epochs = 1\n", policy = "[lr_policy]\nname = \"constant\"\n";
    text.replace(text.find(epochs), epochs.size(), "epochs = 4\n");
    text.replace(text.find(policy), policy.size(),
                 "[lr_policy]\nname = \"plateau\"\nthreshold_mode = \"abs\"\nthreshold = 10.0\n"
                 "patience = 0\nfactor = 0.5\n");
    scratch_.write_text(name + ".toml", text);
  };
  plateau("plateau2");
  plateau("plateau1");
  Result two = run("plateau2", 2);
  ASSERT_EQ(two.code, 0) << two.output;
  Result one = run("plateau1", 0);
  ASSERT_EQ(one.code, 0) << one.output;
  const int steps = 4 * kTrain / 32;
  EXPECT_LT(max_diff(weights("plateau2", steps), weights("plateau1", steps)), kTolerance);
  const auto rates = [&](const std::string& name) {
    std::ifstream in(scratch_.path(name + ".jsonl"));
    const std::regex lr(R"(\{"type":"step","step":(\d+),.*?"lr":\[([-0-9.e+]+))");
    std::vector<double> out;
    std::smatch m;
    for (std::string line; std::getline(in, line);) {
      if (std::regex_search(line, m, lr)) out.push_back(std::stod(m[2]));
    }
    return out;
  };
  const std::vector<double> r2 = rates("plateau2"), r1 = rates("plateau1");
  ASSERT_EQ(r2.size(), static_cast<size_t>(steps));
  EXPECT_EQ(r2, r1);
  const int per_epoch = kTrain / 32;
  EXPECT_DOUBLE_EQ(r2[2 * per_epoch - 1], kLr);  // step 40
  EXPECT_DOUBLE_EQ(r2[2 * per_epoch], kLr / 2);  // step 41
  EXPECT_DOUBLE_EQ(r2[3 * per_epoch], kLr / 4);  // step 61
}

TEST_F(Ddp, TorchrunStartsKilnRanks) {
  // torchrun (from the oracle's torch) sets RANK, WORLD_SIZE, … as kiln launch does.
  pipeline("launch", 32, 1, 6);
  pipeline("torchrun", 32, 1, 6);
  Result a = run("launch", 2);
  ASSERT_EQ(a.code, 0) << a.output;
  Result b = shell(std::string(KILN_TEST_PYTHON) +
                   " -m torch.distributed.run --no-python --nproc-per-node 2 --master-port " +
                   std::to_string(21000 + (::getpid() + 7) % 20000) + " " + KILN_CLI + " run " +
                   scratch_.path("torchrun.toml"));
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find("rank 0 of 2 joined the gloo group"), std::string::npos) << b.output;
  EXPECT_EQ(max_diff(weights("torchrun", 6), weights("launch", 6)), 0.0);
}

TEST_F(Ddp, PlainCPluginsReachTheRunsProcessGroup) {
  // c_sum_sgd (tests/plugins/good_c_collective.c) sums each gradient over the ranks through
  // kiln_host_api.allreduce: on 2 ranks, where DDP already averaged them, that is c_sgd at twice
  // the lr; in one process it is c_sgd.
  auto write = [&](const std::string& name, const std::string& optimizer, double lr) {
    pipeline(name, 32, 1, 8);
    std::string text = scratch_.read_text(name + ".toml");
    const std::string from = "[optimizer]\nname = \"sgd\"";
    text.replace(text.find(from), text.find("[lr_policy]") - text.find(from),
                 "[optimizer]\nname = \"" + optimizer + "\"\nlr = " + std::to_string(lr) + "\n");
    text += std::string("[plugins]\npaths = [\"") + KILN_TEST_PLUGIN_DIR + "/good\"]\n";
    scratch_.write_text(name + ".toml", text);
  };
  write("sum2", "c_sum_sgd", 0.05);
  write("sgd2", "c_sgd", 0.1);
  write("sum1", "c_sum_sgd", 0.05);
  write("sgd1", "c_sgd", 0.05);
  for (const char* name : {"sum2", "sgd2"}) {
    Result r = run(name, 2);
    ASSERT_EQ(r.code, 0) << name << ":\n" << r.output;
  }
  for (const char* name : {"sum1", "sgd1"}) {
    Result r = run(name, 0);
    ASSERT_EQ(r.code, 0) << name << ":\n" << r.output;
  }
  EXPECT_LT(max_diff(weights("sum2", 8), weights("sgd2", 8)), 1e-6);
  EXPECT_EQ(max_diff(weights("sum1", 8), weights("sgd1", 8)), 0.0);
}

TEST_F(Ddp, OptionsKeepTheResult) {
  // find_unused_parameters (a graph walk each step) and gradient_as_bucket_view (default: the
  // gradients alias the buckets; false: copied back, as DDP's default) change how, not what;
  // 16-bit compression changes the result by rounding only.
  pipeline("base", 32, 1, 10);
  pipeline("unused", 32, 1, 10, "find_unused_parameters = true\n");
  pipeline("copy", 32, 1, 10, "gradient_as_bucket_view = false\n");
  pipeline("fp16", 32, 1, 10, "gradient_compression = \"fp16\"\n");
  pipeline("bf16", 32, 1, 10, "gradient_compression = \"bf16\"\n");
  for (const char* name : {"base", "unused", "copy", "fp16", "bf16"}) {
    Result r = run(name, 2);
    ASSERT_EQ(r.code, 0) << name << ":\n" << r.output;
  }
  EXPECT_LT(max_diff(weights("unused", 10), weights("base", 10)), kTolerance);
  EXPECT_LT(max_diff(weights("copy", 10), weights("base", 10)), kTolerance);
  const double fp16 = max_diff(weights("fp16", 10), weights("base", 10));
  const double bf16 = max_diff(weights("bf16", 10), weights("base", 10));
  EXPECT_GT(fp16, 0.0);  // the gradients did travel as 16-bit values
  EXPECT_LT(fp16, 1e-3);
  EXPECT_GT(bf16, fp16);  // bf16 keeps 8 mantissa bits to fp16's 11
  EXPECT_LT(bf16, 1e-2);
}

TEST_F(Ddp, ResumedRunEqualsTheUninterruptedOne) {
  // Both ranks restore the checkpoint rank 0 wrote at step 6 and go on to step 12.
  pipeline("whole", 32, 1, 12);
  pipeline("half", 32, 1, 6);
  Result whole = run("whole", 2);
  ASSERT_EQ(whole.code, 0) << whole.output;
  Result first = run("half", 2);
  ASSERT_EQ(first.code, 0) << first.output;
  pipeline("half", 32, 1, 12);
  Result second = shell(std::string(KILN_CLI) + " launch --nproc 2 " + scratch_.path("half.toml") +
                        " --resume auto");
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  EXPECT_LT(max_diff(weights("half", 12), weights("whole", 12)), 1e-6);
}

TEST_F(Ddp, GlobalBatchMustDivideByTheWorldSize) {
  pipeline("odd", 33, 1, 2);
  Result r = run("odd", 2);
  EXPECT_EQ(r.code, 2) << r.output;  // a configuration error on every rank, before joining
  EXPECT_NE(r.output.find(".toml:13:14: data.batch_size: 33 is the global batch and must be a "
                          "multiple of the world size 2"),
            std::string::npos)
      << r.output;
}

// The prepared pipeline with an mlp whose hidden layers have norm layers (the model's own
// seeded initialisation: the norm parameters are not in init.safetensors) and `model_extra`.
void with_norm_layers(kiln::test::Scratch& scratch, const std::string& name,
                      const std::string& model_extra) {
  std::string text = scratch.read_text(name + ".toml");
  const size_t init = text.find("init = ");
  text.erase(init, text.find('\n', init) + 1 - init);
  text.replace(text.find("[model]\n"), 8, "[model]\nnorm_layers = true\n" + model_extra);
  scratch.write_text(name + ".toml", text);
}

TEST_F(Ddp, SyncBnOnTwoRanksEqualsBatchNormOnTheGlobalBatch) {
  // syncbn shares batch statistics over the ranks, so 2 ranks x 16 samples normalise like one
  // process over the 32: weights and running statistics (checkpointed buffers) agree to 1e-5.
  // Plain batchnorm on 2 ranks normalises each half alone and must differ.
  pipeline("sync2", 32, 1, 10);
  with_norm_layers(scratch_, "sync2", "norm = \"syncbn\"\n");
  pipeline("bn1", 32, 1, 10);
  with_norm_layers(scratch_, "bn1", "");
  pipeline("bn2", 32, 1, 10);
  with_norm_layers(scratch_, "bn2", "");
  for (const auto& [name, nproc] :
       {std::pair<const char*, int>{"sync2", 2}, {"bn1", 0}, {"bn2", 2}}) {
    Result r = run(name, nproc);
    ASSERT_EQ(r.code, 0) << name << ":\n" << r.output;
  }
  EXPECT_LT(max_diff(weights("sync2", 10), weights("bn1", 10)), kTolerance);
  EXPECT_GT(max_diff(weights("bn2", 10), weights("bn1", 10)), 1e-3);
}

TEST_F(Ddp, CheckpointedTrainingEqualsPlainTrainingOnTwoRanks) {
  // Recomputed segments hand their parameter gradients to autograd like plain ones, so the
  // Reducer's hooks see each exactly once: same weights to 1e-6 after 10 steps.
  pipeline("plain", 32, 2, 10);
  with_norm_layers(scratch_, "plain", "");
  pipeline("sqrt", 32, 2, 10, "[memory]\ncheckpoint = \"sqrt\"\n");
  with_norm_layers(scratch_, "sqrt", "");
  for (const char* name : {"plain", "sqrt"}) {
    Result r = run(name, 2);
    ASSERT_EQ(r.code, 0) << name << ":\n" << r.output;
  }
  EXPECT_LT(max_diff(weights("sqrt", 10), weights("plain", 10)), 1e-6);
}

class DdpFailure : public Ddp {
 protected:
  // A long run of both ranks, past its first steps, with the rank-1 pid known.
  Background start_long_run(const std::string& name, double timeout_s) {
    // The pipeline's epochs = 1 would end the run after 20 steps: --set gives it many.
    pipeline(name, 32, 1, 1000000, "timeout_s = " + std::to_string(timeout_s) + "\n");
    Background b = start_launch("--grace 2 --nproc 2 " + scratch_.path(name + ".toml") +
                                    " --set run.epochs=100000 --set run.eval=false"
                                    " --set run.checkpoints=false --metrics " +
                                    scratch_.path(name + ".jsonl"),
                                scratch_.path(name + ".log"));
    const bool stepping = wait_for(
        [&] {
          return slurp(scratch_.path(name + ".jsonl")).find("\"step\":3,") != std::string::npos;
        },
        60);
    EXPECT_TRUE(stepping) << slurp(b.log);
    return b;
  }
};

TEST_F(DdpFailure, AKilledRankFailsTheLaunchNamingIt) {
  Background b = start_long_run("killed", 20.0);
  const pid_t victim = rank_pid(b.log, 1);
  ASSERT_GT(victim, 0) << slurp(b.log);
  const auto t0 = std::chrono::steady_clock::now();
  kill(victim, SIGKILL);
  const int code = wait_exit(b.pid, 40);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string log = slurp(b.log);
  EXPECT_NE(code, 0) << log;
  EXPECT_NE(code, -1) << "kiln launch still running 40 s after a rank was killed:\n" << log;
  EXPECT_LT(took, 25.0) << log;
  EXPECT_NE(log.find("rank 1 (pid " + std::to_string(victim) + ") was killed by signal 9"),
            std::string::npos)
      << log;
}

TEST_F(DdpFailure, AHungRankIsNamedByTheOthersAfterTheTimeout) {
  // Rank 1 stops (SIGSTOP): rank 0's collective times out after dist.timeout_s and its error
  // names rank 1 from the heartbeats; the launcher then fails the run.
  Background b = start_long_run("hung", 4.0);
  const pid_t victim = rank_pid(b.log, 1);
  ASSERT_GT(victim, 0) << slurp(b.log);
  kill(victim, SIGSTOP);
  const int code = wait_exit(b.pid, 60);
  kill(victim, SIGKILL);  // in case it was left stopped
  const std::string log = slurp(b.log);
  EXPECT_NE(code, 0) << log;
  EXPECT_NE(code, -1) << "kiln launch still running 60 s after a rank hung:\n" << log;
  EXPECT_TRUE(std::regex_search(
      log, std::regex(R"(stopped responding: rank 1 \(last seen at step \d+\); it died or hung)")))
      << log;
}

}  // namespace
