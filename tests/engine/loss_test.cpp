// The host's loss (host/engine/loss.cpp) against torch's functional losses
// (tests/oracle/loss.py) on the same logits and targets: the value and its gradient w.r.t. the
// logits for cross-entropy with labels, label smoothing, class weights and soft targets, and
// binary cross-entropy (timm's one-hot smoothing, soft targets, weights, pos_weight), in float32
// and from bfloat16 logits under CPU autocast. Then evaluation's sums (one batch's mean is their
// ratio) and the refusals of per-class lists of the wrong length.
#include "engine/loss.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/checks.hpp"
#include "engine/precision.hpp"
#include "tensor_scratch.hpp"

namespace {

using kiln::config::LossSettings;
using kiln::engine::Loss;

constexpr int64_t kN = 6, kC = 7;

struct Case {
  std::string name;
  std::string loss = "cross_entropy";
  double smoothing = 0.0;
  bool weights = false;
  bool pos_weight = false;
  bool soft = false;
  bool bf16 = false;
};

std::string json(const Case& c) {
  return "{\"name\": \"" + c.name + "\", \"loss\": \"" + c.loss +
         "\", \"label_smoothing\": " + std::to_string(c.smoothing) +
         ", \"weights\": " + (c.weights ? "true" : "false") +
         ", \"pos_weight\": " + (c.pos_weight ? "true" : "false") +
         ", \"soft\": " + (c.soft ? "true" : "false") +
         ", \"bf16\": " + (c.bf16 ? "true" : "false") + "}";
}

std::vector<double> values(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

TEST(Loss, MatchesTorchFunctionalLossesAndTheirGradients) {
  std::vector<Case> cases = {
      {"ce"},
      {"ce_smoothing", "cross_entropy", 0.1},
      {"ce_weights", "cross_entropy", 0.0, true},
      {"ce_smoothing_weights", "cross_entropy", 0.2, true},
      {"ce_soft", "cross_entropy", 0.0, false, false, true},
      {"ce_soft_smoothing_weights", "cross_entropy", 0.1, true, false, true},
      {"bce", "bce_with_logits"},
      {"bce_smoothing", "bce_with_logits", 0.1},
      {"bce_weights_pos_weight", "bce_with_logits", 0.1, true, true},
      {"bce_soft", "bce_with_logits", 0.0, false, false, true},
      {"bce_soft_smoothing", "bce_with_logits", 0.1, true, false, true},
  };
  // The same under CPU bfloat16 autocast, the logits a bfloat16 model output.
  for (size_t i = 0, n = cases.size(); i < n; ++i) {
    Case c = cases[i];
    c.name += "_bf16";
    c.bf16 = true;
    cases.push_back(c);
  }
  at::manual_seed(11);
  const at::Tensor logits = at::randn({kN, kC}) * 3.0;
  const at::Tensor labels = at::randint(kC, {kN}, at::kLong);
  // Soft targets as mixup gives them: lambda x one-hot + (1 - lambda) x the reversed batch's.
  const at::Tensor one_hot = at::one_hot(labels, kC).to(at::kFloat);
  const at::Tensor soft = 0.7 * one_hot + 0.3 * one_hot.flip(0);
  const at::Tensor weights = at::rand({kC}) + 0.25;
  const at::Tensor pos_weight = at::rand({kC}) * 2.0 + 0.5;
  kiln::test::TensorScratch scratch;
  scratch.write("logits.bin", logits);
  scratch.write("labels.bin", labels);
  scratch.write("soft.bin", soft);
  scratch.write("weights.bin", weights);
  scratch.write("pos_weight.bin", pos_weight);
  std::string list;
  for (const Case& c : cases) list += (list.empty() ? "" : ", ") + json(c);
  scratch.write_text("config.json", "{\"n\": " + std::to_string(kN) + ", \"c\": " +
                                        std::to_string(kC) + ", \"cases\": [" + list + "]}");
  scratch.run("loss.py");

  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.name);
    LossSettings s;
    s.name = c.loss;
    s.label_smoothing = c.smoothing;
    if (c.weights) s.class_weights = values(weights);
    if (c.pos_weight) s.pos_weight = values(pos_weight);
    const Loss loss(s, kC, at::Device(at::kCPU));
    at::Tensor x = logits.to(c.bf16 ? at::kBFloat16 : at::kFloat).detach().requires_grad_(true);
    at::Tensor value;
    {
      kiln::engine::AutocastScope autocast(at::kCPU, at::kBFloat16, c.bf16);
      value = loss(x, c.soft ? soft : labels);
    }
    ASSERT_EQ(value.scalar_type(), at::kFloat);
    ASSERT_EQ(value.dim(), 0);
    value.backward();
    const float expected = scratch.read("loss_" + std::to_string(i) + ".bin", {1}).item<float>();
    // The same ATen kernels on the same values: float32 to 1e-6 relative; a bfloat16 gradient
    // to one bfloat16 step (2^-8 relative) for a float32 difference on a rounding boundary.
    EXPECT_NEAR(value.item<float>(), expected, 1e-6 * std::abs(expected) + 1e-7);
    const at::Tensor grad = scratch.read("grad_" + std::to_string(i) + ".bin", {kN, kC});
    EXPECT_LE(kiln::test::closeness(x.grad().to(at::kFloat), grad, c.bf16 ? 4e-3 : 1e-6, 1e-7),
              1.0);
  }
}

// Evaluation sums a split batch by batch: total / count of the halves is the whole batch's mean.
TEST(Loss, EvaluationSumsGiveTheWholeBatchMean) {
  at::manual_seed(12);
  const at::Tensor logits = at::randn({kN, kC});
  const at::Tensor labels = at::randint(kC, {kN}, at::kLong);
  for (const std::string name : {"cross_entropy", "bce_with_logits"}) {
    for (const bool weighted : {false, true}) {
      SCOPED_TRACE(name + (weighted ? " weighted" : ""));
      LossSettings s;
      s.name = name;
      s.label_smoothing = 0.1;
      if (weighted) s.class_weights = values(at::rand({kC}) + 0.5);
      const Loss loss(s, kC, at::Device(at::kCPU));
      const Loss::Sums a = loss.sums(logits.slice(0, 0, 2), labels.slice(0, 0, 2));
      const Loss::Sums b = loss.sums(logits.slice(0, 2), labels.slice(0, 2));
      const double mean = ((a.total + b.total) / (a.count + b.count)).item<double>();
      EXPECT_NEAR(mean, loss(logits, labels).item<double>(), 1e-6);
      EXPECT_EQ(a.total.scalar_type(), at::kDouble);
    }
  }
}

TEST(Loss, PerClassListsOfAnotherLengthThanTheClassesAreRefusedAtTheirKey) {
  LossSettings s;
  s.class_weights = {1.0, 2.0};
  try {
    Loss loss(s, kC, at::Device(at::kCPU));
    FAIL() << "2 class weights for 7 classes were accepted";
  } catch (const kiln::engine::PipelineError& e) {
    EXPECT_EQ(e.key(), "loss.class_weights");
    EXPECT_NE(std::string(e.what()).find("has 2 values; the dataset has 7 classes"),
              std::string::npos)
        << e.what();
  }
  LossSettings p;
  p.pos_weight = std::vector<double>(kC, 2.0);
  try {
    Loss loss(p, kC, at::Device(at::kCPU));
    FAIL() << "pos_weight with cross_entropy was accepted";
  } catch (const kiln::engine::PipelineError& e) {
    EXPECT_EQ(e.key(), "loss.pos_weight");
  }
  EXPECT_EQ(kiln::engine::first_loss_key_set(LossSettings{}), "");
  EXPECT_EQ(kiln::engine::first_loss_key_set(p), "loss.pos_weight");
}

}  // namespace
