// syncbn against torch.nn.BatchNorm on the concatenated samples of each statistics group (what
// torch.nn.SyncBatchNorm computes), with ranks as threads of a fake host: outputs, per-rank
// input gradients, summed parameter gradients, running statistics and the collectives used.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "norm_harness.hpp"
#include "tensor_scratch.hpp"

namespace kiln::norm_test {
namespace {

using test::Options;
using test::TensorScratch;

constexpr const char* kLib = "kiln_syncbn";

std::string json_shape(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t d = 0; d < shape.size(); ++d) out << (d ? ", " : "") << shape[d];
  out << "]";
  return out.str();
}

struct SyncCase {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;  // one per rank
  int64_t group_size;
  bool affine;
  bool cuda;
};

class SyncBnVsTorch : public ::testing::TestWithParam<SyncCase> {};

TEST_P(SyncBnVsTorch, EqualsBatchNormOverEachGroupsSamples) {
  const SyncCase& c = GetParam();
  if (c.cuda && !at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Device device = c.cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  const int32_t world = static_cast<int32_t>(c.shapes.size());
  const int32_t k = c.group_size != 0 ? static_cast<int32_t>(c.group_size) : world;
  const int64_t channels = c.shapes[0][1];
  const int train_steps = 3;
  // Tolerance: float32 everywhere; the oracle reduces the concatenated batch at once while the
  // plugin combines per-rank moments (Chan), so results agree to rounding: 1e-5 relative +
  // 1e-5 absolute on O(1) values (1e-4 on CUDA, whose reductions run in another order).
  const double tol = c.cuda ? 1e-4 : 1e-5;
  at::manual_seed(21);

  TensorScratch oracle;
  at::Tensor w, b;
  if (c.affine) {
    w = at::randn({channels}) * 0.5 + 1.0;
    b = at::randn({channels}) * 0.2;
    oracle.write("weight.bin", w);
    oracle.write("bias.bin", b);
  }
  std::vector<std::string> tags;
  for (int s = 0; s < train_steps; ++s) tags.push_back(std::to_string(s));
  tags.push_back("_eval");
  std::map<std::string, std::vector<at::Tensor>> x, gy;
  for (const auto& tag : tags) {
    for (int32_t r = 0; r < world; ++r) {
      // An offset of 3 so a naive sum-of-squares variance would lose digits.
      x[tag].push_back(at::randn(c.shapes[r]) * 2.0 + 3.0 + r);
      gy[tag].push_back(at::randn(c.shapes[r]));
      oracle.write("x" + tag + "_r" + std::to_string(r) + ".bin", x[tag][r]);
      oracle.write("gy" + tag + "_r" + std::to_string(r) + ".bin", gy[tag][r]);
    }
  }
  std::ostringstream config;
  config << "{\"shapes\": [";
  for (int32_t r = 0; r < world; ++r) config << (r ? ", " : "") << json_shape(c.shapes[r]);
  config << "], \"group_size\": " << c.group_size << ", \"eps\": 1e-5, \"momentum\": 0.1"
         << ", \"affine\": " << (c.affine ? "true" : "false")
         << ", \"train_steps\": " << train_steps << "}";
  oracle.write_text("config.json", config.str());
  oracle.run("syncbn.py");

  // One layer instance per rank, as each process of a real run creates its own.
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<State> states;
  for (int32_t r = 0; r < world; ++r) {
    layers.push_back(std::make_unique<Layer>());
    Options options;
    options.set_bool("affine", c.affine).set_int("group_size", c.group_size);
    ASSERT_EQ(create(*layers[r], kLib, "syncbn", options, channels), "");
    states.push_back(make_state(channels, w, b, device));
  }
  const kiln_norm_layout& layout = layers[0]->layout;
  EXPECT_EQ(layout.affine, c.affine ? 1 : 0);
  EXPECT_EQ(layout.running_stats, 1);
  EXPECT_EQ(layout.saves, KILN_NORM_SAVE_INPUT);
  EXPECT_EQ(layout.fused_activation, 0);
  EXPECT_EQ(layout.in_place, 0);
  EXPECT_EQ(layout.frozen, 0);

  ThreadGroup group(world);
  for (const auto& tag : tags) {
    SCOPED_TRACE("step " + tag);
    const bool training = tag != "_eval";
    std::vector<std::string> fwd(world), bwd(world);
    std::vector<at::Tensor> y(world);
    std::vector<Grads> grads(world);
    std::vector<int> fwd_gathers(world), fwd_reduces(world);
    group.reset_counts();
    run_ranks(group, [&](int32_t r, kiln_call_context* ctx) {
      at::Tensor in = x[tag][r].to(device);
      y[r] = at::empty_like(in);
      fwd[r] = forward(*layers[r], ctx, training, in, y[r], states[r]);
      fwd_gathers[r] = group.allgathers(r);
      fwd_reduces[r] = group.allreduces(r);
      if (fwd[r].empty()) {
        bwd[r] =
            backward(*layers[r], ctx, training, gy[tag][r].to(device), in, states[r], grads[r]);
      }
    });
    for (int32_t r = 0; r < world; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      ASSERT_EQ(fwd[r], "");
      ASSERT_EQ(bwd[r], "");
      const std::string suffix = tag + "_r" + std::to_string(r) + ".bin";
      expect_close(y[r], oracle.read("y" + suffix, c.shapes[r]), tol, tol, "output");
      expect_close(grads[r].input, oracle.read("gx" + suffix, c.shapes[r]), tol, tol, "grad_input");
      // Collectives: training forward = ONE allgather; backward = one allreduce over the whole
      // world, or one allgather within subgroups; eval and a lone rank communicate nothing.
      const bool talks = training && k > 1;
      EXPECT_EQ(fwd_gathers[r], talks ? 1 : 0);
      EXPECT_EQ(fwd_reduces[r], 0);
      EXPECT_EQ(group.allgathers(r) - fwd_gathers[r], talks && k < world ? 1 : 0);
      EXPECT_EQ(group.allreduces(r), talks && k == world ? 1 : 0);
    }
    if (c.affine) {
      // Each rank keeps its local parameter gradients; over a group they sum to BN's.
      for (int32_t g = 0; g < world / k; ++g) {
        at::Tensor gw = at::zeros({channels}), gb = at::zeros({channels});
        for (int32_t r = g * k; r < (g + 1) * k; ++r) {
          gw += grads[r].weight.cpu();
          gb += grads[r].bias.cpu();
        }
        const std::string suffix = tag + "_g" + std::to_string(g) + ".bin";
        expect_close(gw, oracle.read("gw" + suffix, {channels}), tol, tol, "sum of grad_weight");
        expect_close(gb, oracle.read("gb" + suffix, {channels}), tol, tol, "sum of grad_bias");
      }
    }
    if (tag == std::to_string(train_steps - 1)) {
      for (int32_t r = 0; r < world; ++r) {
        const std::string g = "_g" + std::to_string(r / k) + ".bin";
        expect_close(states[r].running_mean, oracle.read("rm" + g, {channels}), tol, tol,
                     "running_mean of rank " + std::to_string(r));
        expect_close(states[r].running_var, oracle.read("rv" + g, {channels}), tol, tol,
                     "running_var of rank " + std::to_string(r));
      }
    }
  }
}

std::vector<SyncCase> sync_cases() {
  std::vector<SyncCase> cases = {
      {"even_2x4", {{4, 3, 5, 5}, {4, 3, 5, 5}}, 0, true, false},
      {"uneven_3_5", {{3, 3, 4, 4}, {5, 3, 4, 4}}, 0, true, false},
      // One value per channel on each rank: only the global statistics are defined.
      {"one_sample_per_rank", {{1, 4}, {1, 4}}, 0, true, false},
      {"empty_rank", {{0, 3, 4, 4}, {6, 3, 4, 4}}, 0, true, false},
      {"groups_of_2_on_4",
       {{2, 3, 3, 3}, {2, 3, 3, 3}, {3, 3, 3, 3}, {1, 3, 3, 3}},
       2,
       true,
       false},
      {"plain_3d_input", {{4, 5, 7}, {2, 5, 7}}, 0, false, false},
      {"even_2x4_cuda", {{4, 3, 5, 5}, {4, 3, 5, 5}}, 0, true, true},
      {"groups_of_2_on_4_cuda",
       {{2, 3, 3, 3}, {2, 3, 3, 3}, {3, 3, 3, 3}, {1, 3, 3, 3}},
       2,
       true,
       true}};
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Ranks, SyncBnVsTorch, ::testing::ValuesIn(sync_cases()),
                         [](const auto& info) { return info.param.name; });

// On one rank syncbn is batchnorm: same outputs, gradients and running statistics as the
// batchnorm plugin over three training steps and an eval step, to 1e-5 (float32; the two
// compute the variance in different orders).
TEST(SyncBn, OneRankEqualsBatchnorm) {
  const int64_t channels = 4;
  Layer sync, plain;
  Options so, po;
  ASSERT_EQ(create(sync, kLib, "syncbn", so, channels), "");
  ASSERT_EQ(create(plain, "kiln_batchnorm", "batchnorm", po, channels), "");
  at::manual_seed(3);
  const at::Tensor w = at::randn({channels}) + 1.0, b = at::randn({channels});
  State ss = make_state(channels, w, b, at::kCPU), ps = make_state(channels, w, b, at::kCPU);
  ThreadGroup group(1);
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const bool training = step < 3;
    const at::Tensor x = at::randn({6, channels, 3, 5}) * 3 - 1, gy = at::randn(x.sizes());
    at::Tensor ys = at::empty_like(x), yp = at::empty_like(x);
    Grads gs, gp;
    run_ranks(group, [&](int32_t, kiln_call_context* ctx) {
      ASSERT_EQ(forward(sync, ctx, training, x, ys, ss), "");
      ASSERT_EQ(backward(sync, ctx, training, gy, x, ss, gs), "");
    });
    ASSERT_EQ(forward(plain, nullptr, training, x, yp, ps), "");
    ASSERT_EQ(backward(plain, nullptr, training, gy, x, ps, gp), "");
    expect_close(ys, yp, 1e-5, 1e-5, "output");
    expect_close(gs.input, gp.input, 1e-5, 1e-5, "grad_input");
    expect_close(gs.weight, gp.weight, 1e-5, 1e-5, "grad_weight");
    expect_close(gs.bias, gp.bias, 1e-5, 1e-5, "grad_bias");
    expect_close(ss.running_mean, ps.running_mean, 1e-5, 1e-5, "running_mean");
    expect_close(ss.running_var, ps.running_var, 1e-5, 1e-5, "running_var");
    expect_close(ss.save_mean, ps.save_mean, 1e-5, 1e-5, "save_mean");
    expect_close(ss.save_invstd, ps.save_invstd, 1e-5, 1e-5, "save_invstd");
  }
}

// Half inputs (float32 parameters and statistics) on 2 ranks agree with the float32 run to
// 2e-2 relative + absolute (half rounding of inputs and outputs, ~3 significant digits).
TEST(SyncBn, HalfInputsMatchFloat) {
  const int64_t channels = 3;
  at::manual_seed(8);
  const at::Tensor w = at::randn({channels}) + 1.0, b = at::randn({channels});
  std::vector<at::Tensor> x = {at::randn({3, channels, 4, 4}), at::randn({5, channels, 4, 4})};
  std::vector<at::Tensor> gy = {at::randn(x[0].sizes()), at::randn(x[1].sizes())};
  auto run = [&](at::ScalarType type, std::vector<at::Tensor>& y, std::vector<Grads>& grads) {
    ThreadGroup group(2);
    std::vector<std::unique_ptr<Layer>> layers;
    std::vector<State> states;
    for (int r = 0; r < 2; ++r) {
      layers.push_back(std::make_unique<Layer>());
      Options options;
      ASSERT_EQ(create(*layers[r], kLib, "syncbn", options, channels), "");
      states.push_back(make_state(channels, w, b, at::kCPU));
    }
    run_ranks(group, [&](int32_t r, kiln_call_context* ctx) {
      at::Tensor in = x[r].to(type), out = at::empty_like(in);
      ASSERT_EQ(forward(*layers[r], ctx, true, in, out, states[r]), "");
      ASSERT_EQ(backward(*layers[r], ctx, true, gy[r].to(type), in, states[r], grads[r]), "");
      y[r] = out.to(at::kFloat);
    });
  };
  std::vector<at::Tensor> ref(2), half(2);
  std::vector<Grads> ref_g(2), half_g(2);
  run(at::kFloat, ref, ref_g);
  for (at::ScalarType type : {at::kHalf, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(type));
    run(type, half, half_g);
    for (int r = 0; r < 2; ++r) {
      expect_close(half[r], ref[r], 2e-2, 2e-2, "output");
      expect_close(half_g[r].input.to(at::kFloat), ref_g[r].input, 2e-2, 2e-2, "grad_input");
      expect_close(half_g[r].weight, ref_g[r].weight, 2e-2, 2e-2, "grad_weight");
    }
  }
}

// Fewer than two values per channel over all ranks cannot give training statistics.
TEST(SyncBn, RefusesOneValuePerChannelInTotal) {
  for (int32_t world : {1, 2}) {
    SCOPED_TRACE("world " + std::to_string(world));
    ThreadGroup group(world);
    std::vector<std::unique_ptr<Layer>> layers;
    std::vector<State> states;
    for (int32_t r = 0; r < world; ++r) {
      layers.push_back(std::make_unique<Layer>());
      Options options;
      ASSERT_EQ(create(*layers[r], kLib, "syncbn", options, 4), "");
      states.push_back(make_state(4, at::ones({4}), at::zeros({4}), at::kCPU));
    }
    std::vector<std::string> status(world);
    run_ranks(group, [&](int32_t r, kiln_call_context* ctx) {
      at::Tensor in = at::randn({r == 0 ? 1 : 0, 4}), out = at::empty_like(in);
      status[r] = forward(*layers[r], ctx, true, in, out, states[r]);
    });
    for (const std::string& s : status) {
      EXPECT_NE(s.find("syncbn: expected more than 1 value per channel when training, got 1"),
                std::string::npos)
          << s;
    }
  }
}

TEST(SyncBn, RefusesGroupSizeThatDoesNotDivideTheWorld) {
  ThreadGroup group(4);
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<State> states;
  for (int32_t r = 0; r < 4; ++r) {
    layers.push_back(std::make_unique<Layer>());
    Options options;
    options.set_int("group_size", 3);
    ASSERT_EQ(create(*layers[r], kLib, "syncbn", options, 2), "");
    states.push_back(make_state(2, at::ones({2}), at::zeros({2}), at::kCPU));
  }
  std::vector<std::string> status(4);
  run_ranks(group, [&](int32_t r, kiln_call_context* ctx) {
    at::Tensor in = at::randn({4, 2}), out = at::empty_like(in);
    status[r] = forward(*layers[r], ctx, true, in, out, states[r]);
  });
  for (const std::string& s : status) {
    EXPECT_NE(s.find("syncbn: group_size 3 does not divide the world size 4"), std::string::npos)
        << s;
  }
  EXPECT_EQ(group.allgathers(0), 0);  // refused before any collective
}

TEST(SyncBn, RefusesBadOptions) {
  struct Bad {
    const char* option;
    double value;
    const char* message;
  };
  for (const Bad& bad : {Bad{"momentum", 1.5, "syncbn: momentum must be in [0, 1], got 1.5"},
                         Bad{"momentum", -0.1, "syncbn: momentum must be in [0, 1], got -0.1"},
                         Bad{"eps", 0.0, "syncbn: eps must be > 0, got 0"},
                         Bad{"group_size", -1, "syncbn: group_size must be >= 0"}}) {
    SCOPED_TRACE(bad.option);
    Options options;
    if (std::string(bad.option) == "group_size") {
      options.set_int(bad.option, static_cast<int64_t>(bad.value));
    } else {
      options.set_float(bad.option, bad.value);
    }
    Layer layer;
    const std::string status = create(layer, kLib, "syncbn", options, 4);
    EXPECT_NE(status.find(bad.message), std::string::npos) << status;
    EXPECT_NE(status.find("code " + std::to_string(KILN_ERR_INVALID_ARGUMENT)), std::string::npos);
    layer.vt = nullptr;  // nothing was created
  }
}

}  // namespace
}  // namespace kiln::norm_test
