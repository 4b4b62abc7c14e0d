// inplace_abn / inplace_abn_sync against torch: F.batch_norm with the weight reparametrised as
// |weight| + eps (mapillary's w_eff), then the activation, autograd for the gradients. The
// plugin writes its output over its input and computes backward from that output alone.
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

constexpr const char* kLib = "kiln_inplace_abn";
constexpr int kTrainSteps = 3;

struct AbnCase {
  std::string name;
  std::vector<int64_t> shape;  // the whole batch (split over the ranks when synchronised)
  int32_t activation;
  double param;
  bool affine;
  int32_t ranks;  // 1: inplace_abn; > 1: inplace_abn_sync on that many threads
  bool cuda;
};

const char* activation_name(int32_t a) {
  return a == KILN_ACT_LEAKY_RELU ? "leaky_relu" : a == KILN_ACT_ELU ? "elu" : "identity";
}

std::vector<std::string> tags() {
  std::vector<std::string> t;
  for (int s = 0; s < kTrainSteps; ++s) t.push_back(std::to_string(s));
  t.push_back("_eval");
  return t;
}

// Weights of both signs with |w| in [0.5, 1.5], so the sign handling of w_eff = |w| + eps is
// exercised and the affine map stays well conditioned.
at::Tensor mixed_sign_weight(int64_t channels) {
  at::Tensor sign = at::where(at::arange(channels) % 2 == 0, 1.0, -1.0).to(at::kFloat);
  return (at::rand({channels}) + 0.5) * sign;
}

// Runs the oracle for `c` on inputs x[tag] / gy[tag] of the whole batch.
void run_oracle(const TensorScratch& oracle, const AbnCase& c, const at::Tensor& w,
                const at::Tensor& b, std::map<std::string, at::Tensor>& x,
                std::map<std::string, at::Tensor>& gy) {
  if (c.affine) {
    oracle.write("weight.bin", w);
    oracle.write("bias.bin", b);
  }
  for (const auto& tag : tags()) {
    // Mean 1, std 2: plenty of negative normalised values for the activations.
    x[tag] = at::randn(c.shape) * 2.0 + 1.0;
    gy[tag] = at::randn(c.shape);
    oracle.write("x" + tag + ".bin", x[tag]);
    oracle.write("gy" + tag + ".bin", gy[tag]);
  }
  std::ostringstream config;
  config << "{\"shape\": [";
  for (size_t d = 0; d < c.shape.size(); ++d) config << (d ? ", " : "") << c.shape[d];
  config << "], \"activation\": \"" << activation_name(c.activation) << "\", \"param\": " << c.param
         << ", \"eps\": 1e-5, \"momentum\": 0.1, \"affine\": " << (c.affine ? "true" : "false")
         << ", \"train_steps\": " << kTrainSteps << "}";
  oracle.write_text("config.json", config.str());
  oracle.run("inplace_abn.py");
}

class AbnVsTorch : public ::testing::TestWithParam<AbnCase> {};

TEST_P(AbnVsTorch, InPlaceForwardAndBackwardFromOutputMatch) {
  const AbnCase& c = GetParam();
  if (c.cuda && !at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Device device = c.cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  const int64_t channels = c.shape[1];
  const int32_t world = c.ranks;
  const char* component = world > 1 ? "inplace_abn_sync" : "inplace_abn";
  // Tolerance 1e-4 relative (+1e-5 absolute) on CPU: backward recovers xhat from the float32
  // output by inverting the activation and the affine map, which costs a few ulps relative to
  // autograd on the saved input. CUDA: 2e-4 (other reduction order).
  const double rtol = c.cuda ? 2e-4 : 1e-4, atol = c.cuda ? 2e-5 : 1e-5;
  at::manual_seed(13);
  TensorScratch oracle;
  const at::Tensor w = mixed_sign_weight(channels), b = at::randn({channels}) * 0.3;
  std::map<std::string, at::Tensor> x, gy;
  run_oracle(oracle, c, w, b, x, gy);

  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<State> states;
  for (int32_t r = 0; r < world; ++r) {
    layers.push_back(std::make_unique<Layer>());
    Options options;
    options.set_bool("affine", c.affine);
    ASSERT_EQ(create(*layers[r], kLib, component, options, channels, c.activation, c.param), "");
    states.push_back(
        make_state(channels, c.affine ? w : at::Tensor(), c.affine ? b : at::Tensor(), device));
  }
  const kiln_norm_layout& layout = layers[0]->layout;
  EXPECT_EQ(layout.in_place, 1);
  EXPECT_EQ(layout.saves, KILN_NORM_SAVE_OUTPUT);
  EXPECT_EQ(layout.fused_activation, 1);
  EXPECT_EQ(layout.affine, c.affine ? 1 : 0);
  EXPECT_EQ(layout.running_stats, 1);
  EXPECT_EQ(layout.frozen, 0);

  const int64_t per_rank = c.shape[0] / world;
  ThreadGroup group(world);
  for (const auto& tag : tags()) {
    SCOPED_TRACE("step " + tag);
    const bool training = tag != "_eval";
    std::vector<at::Tensor> buffer(world);
    std::vector<void*> buffer_data(world);
    std::vector<Grads> grads(world);
    std::vector<std::string> fwd(world), bwd(world);
    run_ranks(group, [&](int32_t r, kiln_call_context* ctx) {
      // One tensor is input and output, as the host passes an in-place layer.
      buffer[r] = x[tag].narrow(0, r * per_rank, per_rank).to(device).clone();
      buffer_data[r] = buffer[r].data_ptr();
      fwd[r] = forward(*layers[r], ctx, training, buffer[r], buffer[r], states[r]);
      if (!fwd[r].empty()) return;
      bwd[r] =
          backward(*layers[r], ctx, training, gy[tag].narrow(0, r * per_rank, per_rank).to(device),
                   buffer[r], states[r], grads[r]);
    });
    const at::Tensor y = oracle.read("y" + tag + ".bin", c.shape);
    const at::Tensor gx = oracle.read("gx" + tag + ".bin", c.shape);
    at::Tensor gw = at::zeros({channels}), gb = at::zeros({channels});
    for (int32_t r = 0; r < world; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      ASSERT_EQ(fwd[r], "");
      ASSERT_EQ(bwd[r], "");
      // The input's own memory now holds the output.
      EXPECT_EQ(buffer[r].data_ptr(), buffer_data[r]);
      expect_close(buffer[r], y.narrow(0, r * per_rank, per_rank), rtol, atol,
                   "output written over the input");
      expect_close(grads[r].input, gx.narrow(0, r * per_rank, per_rank), rtol, atol, "grad_input");
      if (c.affine) {
        gw += grads[r].weight.cpu();
        gb += grads[r].bias.cpu();
      }
    }
    if (c.affine) {
      // Local parameter gradients, summed over the ranks: the whole batch's.
      expect_close(gw, oracle.read("gw" + tag + ".bin", {channels}), rtol, atol, "grad_weight");
      expect_close(gb, oracle.read("gb" + tag + ".bin", {channels}), rtol, atol, "grad_bias");
    }
  }
  for (int32_t r = 0; r < world; ++r) {
    expect_close(states[r].running_mean, oracle.read("running_mean.bin", {channels}), rtol, atol,
                 "running_mean");
    expect_close(states[r].running_var, oracle.read("running_var.bin", {channels}), rtol, atol,
                 "running_var");
  }
}

std::vector<AbnCase> abn_cases() {
  std::vector<AbnCase> cases = {
      {"leaky_0_01", {6, 4, 5, 5}, KILN_ACT_LEAKY_RELU, 0.01, true, 1, false},
      {"leaky_0_3", {6, 4, 5, 5}, KILN_ACT_LEAKY_RELU, 0.3, true, 1, false},
      {"elu", {6, 4, 5, 5}, KILN_ACT_ELU, 1.0, true, 1, false},
      {"identity", {6, 4, 5, 5}, KILN_ACT_NONE, 0.0, true, 1, false},
      {"leaky_no_affine", {4, 3, 6}, KILN_ACT_LEAKY_RELU, 0.01, false, 1, false},
      {"sync_2_ranks_leaky", {8, 4, 5, 5}, KILN_ACT_LEAKY_RELU, 0.01, true, 2, false},
      {"sync_2_ranks_elu_alpha_0_5_1d", {16, 6}, KILN_ACT_ELU, 0.5, true, 2, false},
      {"leaky_0_01_cuda", {6, 4, 5, 5}, KILN_ACT_LEAKY_RELU, 0.01, true, 1, true},
      {"sync_2_ranks_elu_cuda", {8, 4, 3, 3}, KILN_ACT_ELU, 1.0, true, 2, true}};
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Activations, AbnVsTorch, ::testing::ValuesIn(abn_cases()),
                         [](const auto& info) { return info.param.name; });

// Half inputs (float32 parameters and statistics) run and stay close to the float32 oracle.
// Tolerance 3e-2 relative + 3e-2 absolute on O(1) values: the in-place output is rounded to the
// half type (bf16: 8 significant bits, ~4e-3) and backward inverts that rounded output, so
// recovered xhat and the gradients inherit a few half ulps.
TEST(InplaceAbn, HalfInputsMatchTorch) {
  const AbnCase c{"half", {6, 4, 5, 5}, KILN_ACT_LEAKY_RELU, 0.01, true, 1, false};
  const int64_t channels = c.shape[1];
  at::manual_seed(17);
  TensorScratch oracle;
  const at::Tensor w = mixed_sign_weight(channels), b = at::randn({channels}) * 0.3;
  std::map<std::string, at::Tensor> x, gy;
  run_oracle(oracle, c, w, b, x, gy);
  for (at::ScalarType type : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(type));
    Layer layer;
    Options options;
    ASSERT_EQ(create(layer, kLib, "inplace_abn", options, channels, c.activation, c.param), "");
    State state = make_state(channels, w, b, at::kCPU);
    for (const auto& tag : tags()) {
      SCOPED_TRACE("step " + tag);
      const bool training = tag != "_eval";
      at::Tensor buffer = x[tag].to(type);
      ASSERT_EQ(forward(layer, nullptr, training, buffer, buffer, state), "");
      Grads grads;
      ASSERT_EQ(backward(layer, nullptr, training, gy[tag].to(type), buffer, state, grads), "");
      EXPECT_EQ(buffer.scalar_type(), type);
      expect_close(buffer, oracle.read("y" + tag + ".bin", c.shape), 3e-2, 3e-2, "output");
      expect_close(grads.input, oracle.read("gx" + tag + ".bin", c.shape), 3e-2, 3e-2,
                   "grad_input");
      expect_close(grads.weight, oracle.read("gw" + tag + ".bin", {channels}), 3e-2, 3e-2,
                   "grad_weight");
      expect_close(grads.bias, oracle.read("gb" + tag + ".bin", {channels}), 3e-2, 3e-2,
                   "grad_bias");
    }
    expect_close(state.running_mean, oracle.read("running_mean.bin", {channels}), 3e-2, 3e-2,
                 "running_mean");
    expect_close(state.running_var, oracle.read("running_var.bin", {channels}), 3e-2, 3e-2,
                 "running_var");
  }
}

TEST(InplaceAbn, RefusesActivationsItCannotInvert) {
  struct Bad {
    int32_t activation;
    double param;
    const char* message;
  };
  for (const char* component : {"inplace_abn", "inplace_abn_sync"}) {
    for (const Bad& bad :
         {Bad{KILN_ACT_RELU, 0.0, ": relu is not invertible"},
          Bad{KILN_ACT_LEAKY_RELU, 0.0, ": leaky_relu with slope 0.000000 is not invertible"},
          Bad{KILN_ACT_LEAKY_RELU, -0.1, ": leaky_relu with slope -0.100000 is not invertible"},
          Bad{KILN_ACT_ELU, 0.0, ": elu with alpha 0.000000 is not invertible"}}) {
      SCOPED_TRACE(std::string(component) + " " + bad.message);
      Layer layer;
      Options options;
      const std::string status =
          create(layer, kLib, component, options, 4, bad.activation, bad.param);
      EXPECT_NE(status.find(std::string(component) + bad.message), std::string::npos) << status;
      EXPECT_NE(status.find("code " + std::to_string(KILN_ERR_UNSUPPORTED)), std::string::npos);
      if (bad.activation != KILN_ACT_ELU) {
        // The reason names the way out.
        EXPECT_NE(status.find("slope > 0"), std::string::npos) << status;
      }
    }
  }
}

TEST(InplaceAbn, SyncRefusesGroupSizeThatDoesNotDivideTheWorld) {
  ThreadGroup group(4);
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<State> states;
  for (int32_t r = 0; r < 4; ++r) {
    layers.push_back(std::make_unique<Layer>());
    Options options;
    options.set_int("group_size", 3);
    ASSERT_EQ(create(*layers[r], kLib, "inplace_abn_sync", options, 2, KILN_ACT_LEAKY_RELU, 0.01),
              "");
    states.push_back(make_state(2, at::ones({2}), at::zeros({2}), at::kCPU));
  }
  std::vector<std::string> status(4);
  run_ranks(group, [&](int32_t r, kiln_call_context* ctx) {
    at::Tensor buffer = at::randn({4, 2});
    status[r] = forward(*layers[r], ctx, true, buffer, buffer, states[r]);
  });
  for (const std::string& s : status) {
    EXPECT_NE(s.find("inplace_abn_sync: group_size 3 does not divide the world size 4"),
              std::string::npos)
        << s;
  }
}

}  // namespace
}  // namespace kiln::norm_test
