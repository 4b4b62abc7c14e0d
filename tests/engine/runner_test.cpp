// The checkpointed runner's mechanics on toy chains: gradients equal the plain run's (to 1e-6),
// parameter gradients leave through the segment node into AccumulateGrad, inputs without grad,
// grad mode off, autocast replayed in the recomputation, and the caller's RNG left as it was.
#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/activation_checkpoint.hpp"
#include "engine/precision.hpp"
#include "graph_util.hpp"
#include "toy_model.hpp"

namespace {

using kiln::engine::apply_activation_checkpointing;
using kiln_test::checkpoint_nodes;
using kiln_test::ToyModel;

constexpr double kTol = 1e-6;  // gradients of a checkpointed run vs the plain run, absolute

std::map<std::string, at::Tensor> take_grads(kiln::Model& model) {
  std::map<std::string, at::Tensor> grads;
  for (auto& p : model.named_parameters()) {
    grads[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : at::Tensor();
    p.value().mutable_grad() = at::Tensor();
  }
  return grads;
}

void expect_same_grads(const std::map<std::string, at::Tensor>& got,
                       const std::map<std::string, at::Tensor>& want, double tol = kTol) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, g] : want) {
    const at::Tensor& c = got.at(name);
    ASSERT_EQ(c.defined(), g.defined()) << name;
    if (!g.defined()) continue;
    EXPECT_LE((c - g).abs().max().item<double>(), tol) << name;
  }
}

TEST(CheckpointRunner, InputWithoutGradStillGetsParameterGradients) {
  at::manual_seed(1);
  ToyModel model(6, {{"layers", 4}});
  const at::Tensor x = at::randn({5, 6});  // no grad, like images
  model.forward(x).square().sum().backward();
  const auto plain = take_grads(model);

  apply_activation_checkpointing(model, {"layers.0", "layers.2"});
  at::Tensor out = model.forward(x);
  ASSERT_TRUE(out.requires_grad());
  EXPECT_EQ(checkpoint_nodes(out).size(), 2u);
  out.square().sum().backward();
  expect_same_grads(take_grads(model), plain);
}

TEST(CheckpointRunner, InputGradientMatches) {
  at::manual_seed(2);
  ToyModel model(6, {{"a", 3}, {"b", 2}});
  const at::Tensor x0 = at::randn({4, 6});
  at::Tensor x = x0.clone().requires_grad_();
  model.forward(x).sum().backward();
  const auto plain = take_grads(model);
  const at::Tensor plain_input_grad = x.grad().clone();

  apply_activation_checkpointing(model, {"sqrt"});  // n = 5, k = 3: a [0-2], b [0-1]
  at::Tensor y = x0.clone().requires_grad_();
  model.forward(y).sum().backward();
  expect_same_grads(take_grads(model), plain);
  EXPECT_LE((y.grad() - plain_input_grad).abs().max().item<double>(), kTol);
}

TEST(CheckpointRunner, ParameterGradientsFlowIntoAccumulateGrad) {
  at::manual_seed(3);
  ToyModel model(4, {{"layers", 3}});
  apply_activation_checkpointing(model, {"layers"});
  const at::Tensor x = at::randn({2, 4});
  at::Tensor out = model.forward(x);
  const auto nodes = checkpoint_nodes(out);
  ASSERT_EQ(nodes.size(), 1u);
  // The segment node's edges lead to each parameter's AccumulateGrad (where DDP hooks in).
  std::set<torch::autograd::Node*> next;
  for (const auto& e : nodes[0]->next_edges()) next.insert(e.function.get());
  for (const auto& p : model.parameters()) {
    EXPECT_EQ(next.count(torch::autograd::impl::grad_accumulator(p).get()), 1u);
  }
  // Two backward passes accumulate: twice one pass's gradient.
  out.sum().backward();
  const auto once = take_grads(model);
  model.forward(x).sum().backward();
  model.forward(x).sum().backward();
  auto twice = take_grads(model);
  for (auto& [name, g] : twice) g = g / 2;
  expect_same_grads(twice, once);
}

TEST(CheckpointRunner, RunsPlainlyWithoutGradMode) {
  at::manual_seed(4);
  ToyModel model(4, {{"layers", 3}});
  const at::Tensor x = at::randn({2, 4});
  const at::Tensor plain = model.forward(x).detach();
  apply_activation_checkpointing(model, {"sqrt"});
  at::NoGradGuard no_grad;
  at::Tensor out = model.forward(x);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_TRUE(at::equal(out, plain));
}

TEST(CheckpointRunner, RecomputesUnderTheForwardsAutocast) {
  at::manual_seed(5);
  ToyModel model(8, {{"layers", 4}});
  const at::Tensor x = at::randn({3, 8});
  auto run = [&] {
    at::Tensor loss;
    {
      kiln::engine::AutocastScope autocast(c10::DeviceType::CPU, at::kBFloat16, true);
      at::Tensor out = model.forward(x);
      EXPECT_EQ(out.scalar_type(), at::kBFloat16);
      loss = out.to(at::kFloat).square().sum();
    }
    loss.backward();  // outside autocast, as the trainer runs it
    return take_grads(model);
  };
  const auto plain = run();
  apply_activation_checkpointing(model, {"sqrt"});
  expect_same_grads(run(), plain);
  // The check can fail: a float32 recomputation gives gradients far from bf16's.
  apply_activation_checkpointing(model, {"none"});
  model.forward(x).square().sum().backward();
  const auto fp32 = take_grads(model);
  double worst = 0;
  for (const auto& [name, g] : fp32) {
    worst = std::max(worst, (g - plain.at(name)).abs().max().item<double>());
  }
  EXPECT_GT(worst, 1e-4);
}

// One step seeded with `seed` on `device`: output, gradients, and draws after forward and after
// backward (from the device's generator).
struct SeededStep {
  at::Tensor out, between, after;
  std::map<std::string, at::Tensor> grads;
};

SeededStep seeded_step(ToyModel& model, const at::Tensor& x, uint64_t seed) {
  SeededStep s;
  at::manual_seed(seed);  // seeds the CPU and every CUDA generator
  at::Tensor out = model.forward(x);
  s.out = out.detach().cpu();
  s.between = at::randn({8}, x.options()).cpu();
  out.sum().backward();
  s.after = at::randn({8}, x.options()).cpu();
  s.grads = take_grads(model);
  for (auto& [name, g] : s.grads) g = g.cpu();
  return s;
}

void expect_dropout_replayed(c10::Device device) {
  at::manual_seed(6);
  ToyModel model(16, {{"layers", 4}}, /*dropout=*/0.5);
  model.to(device);
  const at::Tensor x = at::randn({8, 16}).to(device);
  const SeededStep plain = seeded_step(model, x, 99);
  apply_activation_checkpointing(model, {"sqrt"});
  const SeededStep ckpt = seeded_step(model, x, 99);
  EXPECT_TRUE(at::equal(ckpt.out, plain.out));
  EXPECT_TRUE(at::equal(ckpt.between, plain.between));
  EXPECT_TRUE(at::equal(ckpt.after, plain.after));  // the recomputation's draws are not visible
  expect_same_grads(ckpt.grads, plain.grads);
  // The check can fail: other masks give other gradients.
  const SeededStep other = seeded_step(model, x, 100);
  double worst = 0;
  for (const auto& [name, g] : other.grads) {
    worst = std::max(worst, (g - plain.grads.at(name)).abs().max().item<double>());
  }
  EXPECT_GT(worst, 1e-3);
}

TEST(CheckpointRunner, ReplaysDropoutAndLeavesTheCallersRngAsThePlainRunDoes) {
  expect_dropout_replayed(c10::Device(c10::kCPU));
}

TEST(CheckpointRunner, ReplaysDropoutOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  expect_dropout_replayed(c10::Device(c10::kCUDA, 0));
}

}  // namespace
