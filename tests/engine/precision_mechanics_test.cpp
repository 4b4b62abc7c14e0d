// The host's precision mechanics with real plugins (mlp + batchnorm model, sgd/adamw, the
// precision policies): O2 master weights, the fp16 underflow that loss scaling prevents, skipped
// steps that touch nothing, accumulation that unscales once, clipping and bf16 autocast against
// PyTorch, and the loss scaler's guards.
#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/pipeline.hpp"
#include "engine/checks.hpp"
#include "engine/gradients.hpp"
#include "engine/graph_step.hpp"
#include "engine/loss.hpp"
#include "engine/loss_scaler.hpp"
#include "engine/lr_driver.hpp"
#include "engine/master_weights.hpp"
#include "engine/memory_format.hpp"
#include "engine/optimizer_step.hpp"
#include "engine/param_groups.hpp"
#include "engine/precision.hpp"
#include "engine/torch_settings.hpp"
#include "kiln/torch.hpp"
#include "kiln_test_paths.h"
#include "plugin/adapters.hpp"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/norm_layer.hpp"
#include "tensor_scratch.hpp"

namespace {

using namespace kiln::engine;
namespace plugin = kiln::plugin;

const plugin::Registry& registry() {
  static plugin::Registry r = [] {
    plugin::LibraryLoader loader(plugin::host_api());
    std::vector<std::string> refused;
    // The built-ins and the plain-C test plugins that work (c_aimd's own scale rule).
    return plugin::load_all(loader, {KILN_PLUGIN_DIR, std::string(KILN_TEST_PLUGIN_DIR) + "/good"},
                            refused);
  }();
  return r;
}

// A model, its parameter groups and the whole optimizer-step machinery of one pipeline, built as
// the trainer builds them (4x4 single-channel inputs, 5 classes).
struct Rig {
  kiln::config::Pipeline p;
  std::shared_ptr<kiln::Model> model;
  std::unique_ptr<plugin::PrecisionAdapter> precision;
  PrecisionPlan plan;
  std::vector<ParamGroup> groups;
  std::unique_ptr<plugin::OptimizerAdapter> optimizer;
  std::unique_ptr<plugin::LrPolicyAdapter> lr_policy;
  std::unique_ptr<LrDriver> lr;
  std::unique_ptr<LossScaler> scaler;
  std::unique_ptr<OptimizerStep> step;

  // `sections`: the pipeline's other tables; `run` and `model`: extra keys of those tables.
  explicit Rig(const std::string& sections, const std::string& run_keys = "",
               const std::string& model_keys = "hidden = [16]\nnorm_layers = true\n") {
    const std::string text = "[run]\ndevice = \"cpu\"\n" + run_keys +
                             "[data]\ndataset = \"synthetic\"\nheight = 4\nwidth = 4\n"
                             "[model]\nname = \"mlp\"\n" +
                             model_keys + sections;
    p = kiln::config::load_pipeline_text(text, "rig.toml", {}, registry());
    at::manual_seed(0);
    const plugin::NormFactory norms = [&](const kiln_norm_request& request) {
      return std::make_shared<plugin::PluginNormLayer>(*p.norm.component, p.norm.options, request);
    };
    kiln_model_input input{};
    input.struct_size = sizeof(input);
    input.channels = 1;
    input.height = 4;
    input.width = 4;
    input.num_classes = 5;
    model = plugin::create_model(*p.model.component, p.model.options, input, &norms);
    precision = std::make_unique<plugin::PrecisionAdapter>(*p.precision.component,
                                                           p.precision.options, c10::kCPU);
    plan = plan_precision(precision->policy(), precision->name());
    cast_model(*model, plan);
    model->train();
    groups = build_param_groups(*model, group_rules(p));
    optimizer =
        std::make_unique<plugin::OptimizerAdapter>(*p.optimizer.component, p.optimizer.options);
    const ScheduleFrame frame = schedule_frame(p, 10);
    lr_policy = std::make_unique<plugin::LrPolicyAdapter>(
        *p.lr_policy.component, p.lr_policy.options, to_policy_schedule(frame));
    lr = std::make_unique<LrDriver>(frame, *lr_policy);
    scaler = std::make_unique<LossScaler>(plan, *precision, p.run.get_int("max_nonfinite_steps"));
    ClipSettings clip;
    clip.max_norm = p.optimizer.core.get_float("clip_grad_norm");
    step = std::make_unique<OptimizerStep>(groups, plan,
                                           std::vector<plugin::OptimizerAdapter*>{optimizer.get()},
                                           *scaler, *lr, clip, nullptr);
  }

  // One micro-batch's forward and scaled backward, as the trainer runs it.
  void backward(const at::Tensor& x, const at::Tensor& y, int64_t window = 1) {
    at::Tensor loss;
    {
      AutocastScope autocast(c10::kCPU, plan.autocast_dtype, plan.autocast);
      at::Tensor input = plan.half_model() ? x.to(plan.model_dtype) : x;
      loss = at::cross_entropy_loss(model->forward(input).to(at::kFloat), y);
    }
    (loss * (scaler->scale() / static_cast<double>(window))).backward();
  }
};

std::pair<at::Tensor, at::Tensor> batch(int64_t n, int64_t seed) {
  at::manual_seed(seed);
  return {at::randn({n, 1, 4, 4}), at::randint(0, 5, {n})};
}

// ---- O2 ----------------------------------------------------------------------------------------

TEST(MasterWeights, O2HalfWeightsEqualTheMastersCastDownAfterEveryStep) {
  Rig rig(
      "[optimizer]\nname = \"adamw\"\nlr = 0.01\nweight_decay = 0.05\n"
      "[precision]\nname = \"o2\"\n");
  ASSERT_TRUE(rig.plan.master_weights);
  ASSERT_EQ(rig.plan.model_dtype, at::kBFloat16);  // auto on the CPU
  const MasterWeights& stepped = rig.step->stepped();
  std::vector<at::Tensor> before;
  for (const auto& t : stepped.flat()) before.push_back(t.detach().clone());
  size_t masters = 0, in_place = 0;
  for (int64_t s = 1; s <= 8; ++s) {
    auto [x, y] = batch(32, s);
    rig.step->zero_grad();
    rig.backward(x, y);
    ASSERT_EQ(rig.step->run(s).verdict, StepVerdict::kApply);
    masters = in_place = 0;
    for (size_t g = 0; g < rig.groups.size(); ++g) {
      for (size_t i = 0; i < rig.groups[g].params.size(); ++i) {
        const at::Tensor& model_param = rig.groups[g].params[i];
        const at::Tensor& master = stepped.groups()[g].params[i];
        ASSERT_EQ(master.scalar_type(), at::kFloat) << rig.groups[g].names[i];
        if (model_param.scalar_type() == at::kFloat) {
          // Norm layers stay fp32 and are stepped in place.
          EXPECT_TRUE(model_param.is_same(master)) << rig.groups[g].names[i];
          ++in_place;
        } else {
          EXPECT_TRUE(at::equal(model_param, master.to(model_param.scalar_type())))
              << "step " << s << ": " << rig.groups[g].names[i];
          ++masters;
        }
      }
    }
  }
  EXPECT_EQ(masters, 4u);   // two linear layers: weight and bias
  EXPECT_EQ(in_place, 2u);  // the norm layer's weight and bias
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_FALSE(at::equal(before[i], stepped.flat()[i])) << stepped.flat_names()[i];
  }
}

// ---- underflow ----------------------------------------------------------------------------------

// d/dw of 1e-4 · Σ(w · x) with x = 1e-4 in float16 is 1e-8: below float16's smallest subnormal
// (6e-8), so it flushes to zero — unless the loss is scaled first and unscaled in fp32.
at::Tensor fp16_gradient_through_masters(double scale) {
  at::Tensor w = at::ones({4}, at::kHalf).requires_grad_(true);
  ParamGroup group;
  group.name = "default";
  group.params = {w};
  group.names = {"w"};
  MasterWeights masters({group}, /*enabled=*/true);
  at::Tensor x = at::full({4}, 1e-4, at::kHalf);
  at::Tensor loss = (w * x).to(at::kFloat).sum() * 1e-4;
  (loss * scale).backward();
  masters.gather_grads();
  GradCheck check = unscale_check_clip(masters.flat(), masters.flat_names(), scale, {});
  EXPECT_TRUE(check.finite);
  return masters.flat()[0].grad().clone();
}

TEST(LossScaling, Fp16GradientsOfOrder1e8VanishWithoutScalingAndSurviveWithIt) {
  at::Tensor unscaled = fp16_gradient_through_masters(1.0);
  EXPECT_TRUE(at::equal(unscaled, at::zeros({4}))) << unscaled;
  at::Tensor scaled = fp16_gradient_through_masters(65536.0);
  // float16 rounding of 1e-4 and of the scaled products: relative error below 1e-3.
  EXPECT_TRUE(at::allclose(scaled, at::full({4}, 1e-8), /*rtol=*/1e-3, /*atol=*/0.0)) << scaled;
}

// ---- skipped steps
// --------------------------------------------------------------------------------

TEST(SkippedStep, LeavesWeightsOptimizerStateAndScheduleBitIdentical) {
  Rig rig(
      "[optimizer]\nname = \"adamw\"\nlr = 0.01\n"
      "[lr_policy]\nwarmup = \"linear\"\nwarmup_iters = 5\n"
      "[precision]\nname = \"amp\"\ndtype = \"fp16\"\n");
  ASSERT_EQ(rig.plan.loss_scaling, KILN_SCALE_DYNAMIC);
  for (int64_t s = 1; s <= 3; ++s) {
    auto [x, y] = batch(32, s);
    rig.step->zero_grad();
    rig.backward(x, y);
    ASSERT_EQ(rig.step->run(s).verdict, StepVerdict::kApply);
  }
  std::vector<at::Tensor> weights;
  for (const auto& t : rig.step->stepped().flat()) weights.push_back(t.detach().clone());
  std::map<std::string, std::map<std::string, at::Tensor>> state;
  for (const auto& [param, tensors] : rig.optimizer->state()) {
    for (const auto& [name, t] : tensors) state[param][name] = t.clone();
  }
  ASSERT_FALSE(state.empty());
  const int64_t counted = rig.lr->counted();
  const double lr_before = rig.lr->current();
  const double scale = rig.scaler->scale();

  auto [x, y] = batch(32, 4);
  rig.step->zero_grad();
  rig.backward(x, y);
  rig.groups[0].params[0].grad().view(-1)[3] = std::numeric_limits<float>::infinity();
  const StepOutcome skipped = rig.step->run(4);
  EXPECT_EQ(skipped.verdict, StepVerdict::kSkip);
  ASSERT_EQ(skipped.check.non_finite.size(), 1u);
  EXPECT_EQ(skipped.check.non_finite[0], rig.groups[0].names[0]);
  EXPECT_EQ(rig.scaler->scale(), scale / 2);
  EXPECT_EQ(rig.scaler->skipped_total(), 1);

  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_TRUE(at::equal(weights[i], rig.step->stepped().flat()[i]))
        << rig.step->stepped().flat_names()[i];
  }
  ASSERT_EQ(rig.optimizer->state().size(), state.size());
  for (const auto& [param, tensors] : rig.optimizer->state()) {
    for (const auto& [name, t] : tensors) {
      EXPECT_TRUE(at::equal(t, state.at(param).at(name))) << param << " " << name;
    }
  }
  EXPECT_EQ(rig.lr->counted(), counted);
  EXPECT_EQ(rig.lr->current(), lr_before);

  // The next clean step applies and the schedule moves on.
  rig.step->zero_grad();
  rig.backward(x, y);
  EXPECT_EQ(rig.step->run(5).verdict, StepVerdict::kApply);
  EXPECT_EQ(rig.lr->counted(), counted + 1);
  EXPECT_FALSE(at::equal(weights[0], rig.step->stepped().flat()[0]));
}

// ---- accumulation
// ---------------------------------------------------------------------------------

TEST(Accumulation, ScaledMicroBatchesUnscaleOnceToTheFullBatchGradient) {
  // fp32 with a static scale of 1024: K micro-batches of B, each backward with scale / K, then
  // one unscale, give the gradient of one batch of K·B.
  Rig rig("[optimizer]\nname = \"sgd\"\nlr = 0.1\n[precision]\nname = \"fp32\"\n");
  rig.model->eval();  // batch norm with running statistics: the same function per micro-batch
  PrecisionPlan plan = rig.plan;
  plan.loss_scaling = KILN_SCALE_STATIC;
  plan.initial_scale = 1024.0;
  LossScaler scaler(plan, *rig.precision, 5);
  MasterWeights stepped(rig.groups, false);
  auto [x, y] = batch(64, 11);
  std::vector<at::Tensor> reference;
  {
    for (auto& t : stepped.flat()) t.mutable_grad() = at::Tensor();
    at::cross_entropy_loss(rig.model->forward(x), y).backward();
    for (const auto& t : stepped.flat()) reference.push_back(t.grad().clone());
  }
  for (auto& t : stepped.flat()) t.mutable_grad() = at::Tensor();
  const int64_t k = 4;
  for (int64_t m = 0; m < k; ++m) {
    at::Tensor loss = at::cross_entropy_loss(rig.model->forward(x.slice(0, 16 * m, 16 * (m + 1))),
                                             y.slice(0, 16 * m, 16 * (m + 1)));
    (loss * (scaler.scale() / k)).backward();
  }
  GradCheck check = unscale_check_clip(stepped.flat(), stepped.flat_names(), scaler.scale(), {});
  ASSERT_TRUE(check.finite);
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(at::allclose(stepped.flat()[i].grad(), reference[i], 1e-5, 1e-7))
        << stepped.flat_names()[i];
  }
}

// ---- clipping against torch
// -----------------------------------------------------------------------

struct ClipCase {
  std::string mode;  // "norm" or "value"
  double limit;
  std::string norm_type;  // "2", "1", "inf"
  double scale;           // gradients carry it and are unscaled first
};

void expect_clip_matches_torch(const std::vector<std::vector<int64_t>>& shapes, const ClipCase& c) {
  SCOPED_TRACE(c.mode + " " + c.norm_type);
  kiln::test::TensorScratch scratch;
  at::manual_seed(3);
  std::vector<at::Tensor> tensors;
  std::vector<std::string> names;
  std::string shape_json;
  for (size_t i = 0; i < shapes.size(); ++i) {
    at::Tensor grad = at::randn(shapes[i]);
    scratch.write("g" + std::to_string(i) + ".bin", grad);
    at::Tensor t = at::zeros(shapes[i]).requires_grad_(true);
    t.mutable_grad() = grad * c.scale;
    tensors.push_back(t);
    names.push_back("t" + std::to_string(i));
    std::string dims;
    for (int64_t d : shapes[i]) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    shape_json += (i ? ",[" : "[") + dims + "]";
  }
  scratch.write_text("config.json", "{\"shapes\": [" + shape_json + "], \"mode\": \"" + c.mode +
                                        "\", \"max_norm\": " + std::to_string(c.limit) +
                                        ", \"max_value\": " + std::to_string(c.limit) +
                                        ", \"norm_type\": " +
                                        (c.norm_type == "inf" ? "\"inf\"" : c.norm_type) + "}");
  scratch.run("clip_grad.py");
  ClipSettings clip;
  clip.norm_type = c.norm_type == "inf" ? INFINITY : std::stod(c.norm_type);
  (c.mode == "norm" ? clip.max_norm : clip.max_value) = c.limit;
  GradCheck check = unscale_check_clip(tensors, names, c.scale, clip);
  ASSERT_TRUE(check.finite);
  if (c.mode == "norm") {
    // float32 sums in another order: relative 1e-6.
    const float total = scratch.read("total.bin", {1}).item<float>();
    EXPECT_NEAR(check.norm, total, 1e-6 * total);
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    at::Tensor expected = scratch.read("c" + std::to_string(i) + ".bin", shapes[i]);
    EXPECT_LE(kiln::test::closeness(tensors[i].grad(), expected, 1e-6, 1e-7), 1.0) << names[i];
  }
}

TEST(Clipping, MatchesTorchClipGradNormAndValueAfterUnscaling) {
  for (const ClipCase& c : {ClipCase{"norm", 0.5, "2", 1024.0}, ClipCase{"norm", 0.7, "1", 1.0},
                            ClipCase{"norm", 0.3, "inf", 8.0}, ClipCase{"norm", 1e6, "2", 1.0},
                            ClipCase{"value", 0.2, "2", 256.0}}) {
    expect_clip_matches_torch({{7, 5}, {5}, {3, 2, 2}}, c);
  }
}

// Unscaled float32 CPU gradients take the host's one-pass norm: over enough elements to split
// into chunks summed in parallel, with tensors whose sizes leave a tail after the SIMD lanes.
TEST(Clipping, OnePassNormOfManyElementsMatchesTorch) {
  expect_clip_matches_torch({{600, 301}, {70001}, {3}, {33, 1}}, ClipCase{"norm", 1.0, "2", 1.0});
}

TEST(Clipping, OnePassNormFindsANaNOrInfAndNamesItsTensor) {
  for (float bad : {NAN, INFINITY}) {
    std::vector<at::Tensor> tensors;
    for (int64_t n : {100000, 17, 40000}) {
      at::Tensor t = at::zeros({n}).requires_grad_(true);
      t.mutable_grad() = at::randn({n});
      tensors.push_back(t);
    }
    tensors[2].mutable_grad()[39999] = bad;
    GradCheck check = unscale_check_clip(tensors, {"a", "b", "c"}, 1.0, {});
    EXPECT_FALSE(check.finite);
    EXPECT_FALSE(std::isfinite(check.norm));
    EXPECT_EQ(check.non_finite, std::vector<std::string>{"c"});
  }
}

// The step's loss rides along with the check's read-back, on the one-pass path (unscaled
// float32) and on the kernel path (scaled), and when no tensor has a gradient.
TEST(Clipping, LossIsReadBackWithTheCheck) {
  at::Tensor t = at::zeros({5}).requires_grad_(true);
  const at::Tensor loss = at::full({}, 2.75);
  t.mutable_grad() = at::ones({5});
  EXPECT_DOUBLE_EQ(unscale_check_clip({t}, {"t"}, 1.0, {}, loss).loss, 2.75);
  t.mutable_grad() = at::ones({5});
  EXPECT_DOUBLE_EQ(unscale_check_clip({t}, {"t"}, 8.0, {}, loss).loss, 2.75);
  t.mutable_grad() = at::Tensor();
  EXPECT_DOUBLE_EQ(unscale_check_clip({t}, {"t"}, 1.0, {}, loss).loss, 2.75);
  EXPECT_TRUE(std::isnan(unscale_check_clip({t}, {"t"}, 1.0, {}).loss));
}

// run.grad_check = "auto" on a step that neither unscales nor clips: the loss alone guards it.
TEST(LossGuard, AFiniteLossPassesWithoutReadingTheGradients) {
  at::Tensor t = at::zeros({4}).requires_grad_(true);
  t.mutable_grad() = at::full({4}, NAN);  // not looked at: no pass over the gradients
  const GradCheck check = check_loss_only({t}, {"t"}, at::full({}, 1.5));
  EXPECT_TRUE(check.finite);
  EXPECT_FALSE(check.measured);
  EXPECT_TRUE(std::isnan(check.norm));
  EXPECT_DOUBLE_EQ(check.loss, 1.5);
  EXPECT_TRUE(check.non_finite.empty());
}

TEST(LossGuard, ANonFiniteLossFailsAndNamesTheNonFiniteGradients) {
  for (float bad : {NAN, INFINITY}) {
    std::vector<at::Tensor> tensors;
    for (int n : {3, 5, 7}) {
      at::Tensor t = at::zeros({n}).requires_grad_(true);
      t.mutable_grad() = at::ones({n});
      tensors.push_back(t);
    }
    tensors[1].mutable_grad()[4] = bad;
    GradCheck check = check_loss_only(tensors, {"a", "b", "c"}, at::full({}, bad));
    EXPECT_FALSE(check.finite);
    EXPECT_EQ(check.non_finite, std::vector<std::string>{"b"});
    // A loss can overflow while every gradient stays finite: it fails all the same.
    tensors[1].mutable_grad() = at::ones({5});
    check = check_loss_only(tensors, {"a", "b", "c"}, at::full({}, bad));
    EXPECT_FALSE(check.finite);
    EXPECT_TRUE(check.non_finite.empty());
  }
  EXPECT_THROW(check_loss_only({}, {}, at::Tensor()), std::invalid_argument);
}

// OptimizerStep::run without the gradient check: a finite loss applies the same update as the
// checked step (no norm measured), a non-finite loss skips it and moves nothing.
TEST(LossGuard, AnUncheckedStepAppliesAsTheCheckedOneAndSkipsOnANonFiniteLoss) {
  const std::string sections =
      "[optimizer]\nname = \"sgd\"\nlr = 0.1\nmomentum = 0.9\n[precision]\nname = \"fp32\"\n";
  Rig checked(sections), unchecked(sections);
  for (int64_t s = 1; s <= 3; ++s) {
    auto [x, y] = batch(16, s);
    for (Rig* rig : {&checked, &unchecked}) {
      rig->step->zero_grad();
      rig->backward(x, y);
    }
    const at::Tensor loss = at::full({}, 0.25 * static_cast<double>(s));
    const StepOutcome a = checked.step->run(s, loss);
    const StepOutcome b = unchecked.step->run(s, loss, /*check_gradients=*/false);
    EXPECT_TRUE(a.check.measured && std::isfinite(a.check.norm));
    EXPECT_FALSE(b.check.measured);
    EXPECT_TRUE(std::isnan(b.check.norm));
    EXPECT_EQ(b.verdict, StepVerdict::kApply);
    EXPECT_DOUBLE_EQ(b.check.loss, 0.25 * static_cast<double>(s));
  }
  for (size_t i = 0; i < checked.step->stepped().flat().size(); ++i) {
    EXPECT_TRUE(at::equal(checked.step->stepped().flat()[i], unchecked.step->stepped().flat()[i]))
        << checked.step->stepped().flat_names()[i];
  }

  std::vector<at::Tensor> weights;
  for (const auto& t : unchecked.step->stepped().flat()) weights.push_back(t.detach().clone());
  auto [x, y] = batch(16, 4);
  unchecked.step->zero_grad();
  unchecked.backward(x, y);
  const StepOutcome skipped = unchecked.step->run(4, at::full({}, NAN), false);
  EXPECT_EQ(skipped.verdict, StepVerdict::kSkip);
  EXPECT_EQ(unchecked.scaler->skipped_total(), 1);
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_TRUE(at::equal(weights[i], unchecked.step->stepped().flat()[i]));
  }
}

// Clipping needs the norm: with it the step takes the full check even when asked not to.
TEST(LossGuard, ClippingKeepsTheGradientCheck) {
  Rig rig(
      "[optimizer]\nname = \"sgd\"\nlr = 0.1\nclip_grad_norm = 0.5\n"
      "[precision]\nname = \"fp32\"\n");
  auto [x, y] = batch(16, 1);
  rig.step->zero_grad();
  rig.backward(x, y);
  const StepOutcome out = rig.step->run(1, at::full({}, 1.0), /*check_gradients=*/false);
  EXPECT_TRUE(out.check.measured);
  EXPECT_TRUE(std::isfinite(out.check.norm));
}

// model.memory_format = "auto" picks NHWC only where it pays: a model with convolution weights,
// on the CPU (oneDNN) or on CUDA under a half precision; the explicit settings win everywhere.
TEST(MemoryFormat, AutoIsChannelsLastForConvolutionsOnTheCpuAndUnderHalfPrecisionOnCuda) {
  torch::nn::Module conv, linear;
  conv.register_parameter("weight", at::zeros({4, 3, 3, 3}));
  linear.register_parameter("weight", at::zeros({4, 3}));
  PrecisionPlan fp32, amp, half;
  amp.autocast = true;
  amp.autocast_dtype = at::kHalf;
  half.model_dtype = at::kBFloat16;
  const at::Device cuda(at::kCUDA, 0), cpu(at::kCPU);
  EXPECT_TRUE(use_channels_last("auto", cuda, amp, conv));
  EXPECT_TRUE(use_channels_last("auto", cuda, half, conv));
  EXPECT_FALSE(use_channels_last("auto", cuda, fp32, conv));
  EXPECT_FALSE(use_channels_last("auto", cuda, amp, linear));
  EXPECT_EQ(use_channels_last("auto", cpu, fp32, conv), at::hasMKLDNN());
  EXPECT_EQ(use_channels_last("auto", cpu, amp, conv), at::hasMKLDNN());
  EXPECT_FALSE(use_channels_last("auto", cpu, fp32, linear));
  EXPECT_TRUE(use_channels_last("channels_last", cpu, fp32, linear));
  EXPECT_FALSE(use_channels_last("contiguous", cuda, amp, conv));
  // Restriding keeps the parameter object (what optimizer groups hold) and its values.
  at::Tensor w = conv.named_parameters()["weight"];
  {
    at::NoGradGuard no_grad;
    w.copy_(at::arange(108, at::kFloat).reshape({4, 3, 3, 3}));
  }
  EXPECT_EQ(to_channels_last(conv), 1);
  EXPECT_TRUE(conv.named_parameters()["weight"].is_same(w));
  EXPECT_TRUE(w.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(w.equal(at::arange(108, at::kFloat).reshape({4, 3, 3, 3})));
  EXPECT_EQ(to_channels_last(linear), 0);
  at::Tensor x = at::randn({2, 3, 5, 5});
  EXPECT_TRUE(in_model_layout(x, true).is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(in_model_layout(x, false).is_same(x));
}

// [run]'s torch settings land in torch's global context (the flags exist without CUDA).
TEST(TorchSettings, RunTableSetsCudnnBenchmarkAndTf32) {
  at::Context& ctx = at::globalContext();
  const bool benchmark = ctx.benchmarkCuDNN();
  const bool tf32_cublas = ctx.allowTF32CuBLAS(), tf32_cudnn = ctx.allowTF32CuDNN();
  apply_torch_settings(Rig("", "cudnn_benchmark = false\ntf32 = \"on\"\n").p.settings.run);
  EXPECT_FALSE(ctx.benchmarkCuDNN());
  EXPECT_TRUE(ctx.allowTF32CuBLAS());
  EXPECT_TRUE(ctx.allowTF32CuDNN());
  apply_torch_settings(
      Rig("", "tf32 = \"off\"\n").p.settings.run);  // cudnn_benchmark's default: on
  EXPECT_TRUE(ctx.benchmarkCuDNN());
  EXPECT_FALSE(ctx.allowTF32CuBLAS());
  EXPECT_FALSE(ctx.allowTF32CuDNN());
  ctx.setBenchmarkCuDNN(benchmark);
  ctx.setAllowTF32CuBLAS(tf32_cublas);
  ctx.setAllowTF32CuDNN(tf32_cudnn);
}

// run.cuda_graph's conditions, each with the reason the run prints.
TEST(CudaGraph, UnsupportedPipelinesAreNamedWithTheReason) {
  GraphConditions ok;
  ok.cuda = true;
  EXPECT_EQ(graph_unsupported_reason(ok), "");
  auto reason = [&](auto change) {
    GraphConditions c = ok;
    change(c);
    return graph_unsupported_reason(c);
  };
  EXPECT_EQ(reason([](GraphConditions& c) { c.cuda = false; }), "CUDA graphs need a CUDA device");
  EXPECT_NE(reason([](GraphConditions& c) { c.world_size = 2; }).find("distributed run"),
            std::string::npos);
  EXPECT_NE(reason([](GraphConditions& c) { c.accumulation = 4; }).find("accumulation"),
            std::string::npos);
  EXPECT_NE(reason([](GraphConditions& c) { c.master_weights = true; }).find("o2"),
            std::string::npos);
  EXPECT_NE(reason([](GraphConditions& c) {
              c.activation_checkpointing = true;
            }).find("memory.checkpoint"),
            std::string::npos);
}

// A graphed step is refused without a CUDA device, before anything asks CUDA for a stream.
TEST(CudaGraph, GraphedStepNeedsACudaDevice) {
  Rig rig("");
  std::vector<at::Tensor> params;
  for (const auto& g : rig.groups) params.insert(params.end(), g.params.begin(), g.params.end());
  const Loss loss(kiln::config::LossSettings{}, 5, at::Device(at::kCPU));
  EXPECT_THROW(GraphedStep(*rig.model, loss, params, rig.plan, 2.0, at::Device(at::kCPU)),
               std::invalid_argument);
}

// The check split for a graph (kernels enqueued, read later) gives what the one-call check
// gives: flag, norm and loss, scaled gradients unscaled by the device-tensor inverse scale.
TEST(CudaGraph, CheckLaunchedAndReadLaterEqualsTheOneCallCheck) {
  at::manual_seed(5);
  auto make = [](double scale) {
    std::vector<at::Tensor> tensors;
    for (int64_t n : {300, 7}) {
      at::Tensor t = at::zeros({n}).requires_grad_(true);
      t.mutable_grad() = at::randn({n}) * scale;
      tensors.push_back(t);
    }
    return tensors;
  };
  at::manual_seed(5);
  std::vector<at::Tensor> a = make(64.0);
  at::manual_seed(5);
  std::vector<at::Tensor> b = make(64.0);
  const at::Tensor loss = at::full({}, 1.5);
  const GradCheck one = unscale_check_clip(a, {"a", "b"}, 64.0, {}, loss);
  const GradCheck split =
      read_gradient_check(launch_gradient_check(b, at::full({1}, 1.0 / 64.0), 2.0, loss));
  EXPECT_TRUE(split.finite);
  EXPECT_NEAR(split.norm, one.norm, 1e-6 * one.norm);
  EXPECT_DOUBLE_EQ(split.loss, 1.5);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(b[i].grad().allclose(a[i].grad()));
  b[1].mutable_grad()[3] = NAN;
  const GradCheck bad = read_gradient_check(launch_gradient_check(b, at::Tensor(), 2.0, {}));
  EXPECT_FALSE(bad.finite);
  EXPECT_TRUE(std::isnan(bad.loss));
  const GradCheck named = clip_after_check(bad, b, {"a", "b"}, {});
  EXPECT_EQ(named.non_finite, std::vector<std::string>{"b"});
}

// The update a CUDA graph captures (clipping and a capturable optimizer enqueued on the device
// check's readout, lr from device tensors, the skip decided on the device), run eagerly on the
// CPU: it gives the eager step's weights, optimizer state, scale, schedule and verdicts, and a
// step with a NaN gradient moves nothing.
void check_device_update(const std::string& optimizer) {
  const std::string sections = "[optimizer]\n" + optimizer +
                               "clip_grad_norm = 0.5\n"
                               "[lr_policy]\nwarmup = \"linear\"\nwarmup_iters = 3\n"
                               "[precision]\nname = \"amp\"\ndtype = \"fp16\"\n";
  Rig eager(sections), device(sections);
  ASSERT_TRUE(device.step->capturable());
  ASSERT_EQ(device.plan.loss_scaling, KILN_SCALE_DYNAMIC);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  for (int64_t s = 1; s <= 6; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    auto [x, y] = batch(32, s);
    std::vector<at::Tensor> before;
    for (Rig* r : {&eager, &device}) {
      r->step->zero_grad();
      r->backward(x, y);
      if (s == 4) r->groups[0].params[0].grad().view(-1)[2] = NAN;
    }
    for (const auto& t : device.step->stepped().flat()) before.push_back(t.detach().clone());
    const StepOutcome e = eager.step->run(s);
    StepOutcome d;
    if (s == 1) {
      d = device.step->run(s);  // the optimizer's state is made eagerly, before any capture
    } else {
      device.step->set_device_lrs();
      const at::Tensor inv_scale = at::full({1}, 1.0 / device.scaler->scale(), f32);
      const at::Tensor readout =
          launch_gradient_check(device.step->stepped().flat(), inv_scale, 2.0, {});
      device.step->enqueue_update(s, readout);
      d = device.step->after_device_update(s, read_gradient_check(readout));
    }
    EXPECT_EQ(d.verdict, e.verdict);
    EXPECT_EQ(d.scale, e.scale);
    EXPECT_EQ(d.group_lrs, e.group_lrs);
    EXPECT_EQ(d.check.non_finite, e.check.non_finite);
    if (e.check.finite) {
      EXPECT_NEAR(d.check.norm, e.check.norm, 1e-6 * e.check.norm);
    }
    EXPECT_EQ(device.scaler->scale(), eager.scaler->scale());
    EXPECT_EQ(device.lr->counted(), eager.lr->counted());
    const auto& dw = device.step->stepped().flat();
    const auto& ew = eager.step->stepped().flat();
    for (size_t i = 0; i < dw.size(); ++i) {
      if (s == 4) {
        EXPECT_TRUE(at::equal(dw[i], before[i])) << "a skipped step moved parameter " << i;
      } else {
        EXPECT_TRUE(dw[i].allclose(ew[i], 1e-5, 1e-6)) << "parameter " << i;
      }
    }
  }
  EXPECT_EQ(device.scaler->skipped_total(), 1);
  for (const auto& [param, tensors] : device.optimizer->state()) {
    for (const auto& [name, t] : tensors) {
      EXPECT_TRUE(t.allclose(eager.optimizer->state().at(param).at(name), 1e-5, 1e-6))
          << param << " " << name;
    }
  }
}

TEST(CudaGraph, DeviceUpdateWithSgdMatchesTheEagerStep) {
  check_device_update("name = \"sgd\"\nlr = 0.1\nmomentum = 0.9\nnesterov = true\n");
}

TEST(CudaGraph, DeviceUpdateWithAdamWMatchesTheEagerStep) {
  check_device_update("name = \"adamw\"\nlr = 0.01\n");
}

TEST(CudaGraph, AnOptimizerWithoutTheCapabilityIsNotCapturable) {
  Rig rig("[optimizer]\nname = \"rmsprop\"\nlr = 0.01\n");
  EXPECT_FALSE(rig.step->capturable());
  EXPECT_THROW(rig.step->enqueue_update(1, at::zeros({3})), std::logic_error);
  // The flag counts only from plugins built for ABI 1.4, which see the device tensors.
  Rig sgd("[optimizer]\nname = \"sgd\"\nlr = 0.01\n");
  EXPECT_TRUE(sgd.step->capturable());
  plugin::Component older = *sgd.p.optimizer.component;
  kiln_plugin_descriptor descriptor = *older.plugin;
  descriptor.abi_minor = 3;
  older.plugin = &descriptor;
  EXPECT_FALSE(plugin::OptimizerAdapter(older, sgd.p.optimizer.options).capturable());
}

// ---- bf16 autocast against torch.autocast
// ---------------------------------------------------------

TEST(Autocast, Bf16MlpOutputsEqualTorchAutocastOnTheSameWeights) {
  Rig rig("[precision]\nname = \"bf16\"\n", "", "hidden = [32, 16]\n");
  ASSERT_TRUE(rig.plan.autocast);
  ASSERT_EQ(rig.plan.autocast_dtype, at::kBFloat16);
  kiln::test::TensorScratch scratch;
  std::string shapes;
  int i = 0;
  for (const auto& item : rig.model->named_parameters()) {
    scratch.write("p" + std::to_string(i++) + ".bin", item.value());
    std::string dims;
    for (int64_t d : item.value().sizes()) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    shapes += (shapes.empty() ? "[" : ",[") + dims + "]";
  }
  at::Tensor x = batch(8, 5).first;
  scratch.write("x.bin", x);
  scratch.write_text("config.json",
                     "{\"shapes\": [" + shapes + "], \"input_shape\": [8, 1, 4, 4]}");
  scratch.run("autocast_mlp.py");
  at::Tensor y;
  {
    at::NoGradGuard no_grad;
    AutocastScope autocast(c10::kCPU, rig.plan.autocast_dtype, rig.plan.autocast);
    y = rig.model->forward(x);
  }
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  // The same ATen kernels run in the same dtypes: equal up to one bf16 ulp (2^-8 relative) for
  // any difference in blocking between the two calls.
  EXPECT_LE(kiln::test::closeness(y.to(at::kFloat), scratch.read("y.bin", {8, 5}), 4e-3, 1e-3),
            1.0);
  // Autocast is off again once the scope ends.
  EXPECT_EQ(rig.model->forward(x).scalar_type(), at::kFloat);
}

// ---- the scaler's guards
// --------------------------------------------------------------------------

TEST(LossScalerGuards, OverflowAtTheMinimumScaleStopsOrSkipsAsConfigured) {
  for (const std::string action : {"stop", "skip"}) {
    Rig rig(
        "[precision]\nname = \"amp\"\ndtype = \"fp16\"\ninit_scale = 4.0\nmin_scale = 1.0\n"
        "at_min_scale = \"" +
        action + "\"\n");
    LossScaler& s = *rig.scaler;
    EXPECT_EQ(s.after_check(false), StepVerdict::kSkip);  // 4 -> 2
    EXPECT_EQ(s.after_check(false), StepVerdict::kSkip);  // 2 -> 1
    EXPECT_EQ(s.scale(), 1.0);
    if (action == "stop") {
      EXPECT_EQ(s.after_check(false), StepVerdict::kStop);
      EXPECT_NE(s.stop_reason().find("minimum loss scale 1"), std::string::npos) << s.stop_reason();
    } else {
      EXPECT_EQ(s.after_check(false), StepVerdict::kSkip);
      EXPECT_EQ(s.scale(), 1.0);  // never below the minimum
      EXPECT_EQ(s.after_check(true), StepVerdict::kApply);
    }
  }
}

TEST(LossScalerGuards, WithoutScalingConsecutiveNonFiniteStepsStopTheRun) {
  Rig rig("[precision]\nname = \"o3\"\nkeep_norm_fp32 = true\n", "max_nonfinite_steps = 3\n");
  LossScaler& s = *rig.scaler;
  EXPECT_EQ(s.after_check(false), StepVerdict::kSkip);
  EXPECT_EQ(s.after_check(false), StepVerdict::kSkip);
  EXPECT_EQ(s.after_check(true), StepVerdict::kApply);  // the count restarts
  EXPECT_EQ(s.after_check(false), StepVerdict::kSkip);
  EXPECT_EQ(s.after_check(false), StepVerdict::kSkip);
  EXPECT_EQ(s.after_check(false), StepVerdict::kStop);
  EXPECT_NE(s.stop_reason().find("3 consecutive steps with non-finite gradients or loss"),
            std::string::npos)
      << s.stop_reason();
  EXPECT_EQ(s.skipped_total(), 5);
}

TEST(LossScalerGuards, AThirdPartyScaleRuleIsWhatTheHostFollows) {
  // tests/plugins/good_c_scaler.c: +1 per clean step, /4 on overflow, floor 1, skip at the floor.
  Rig rig("[precision]\nname = \"c_aimd\"\n");
  ASSERT_EQ(rig.plan.loss_scaling, KILN_SCALE_DYNAMIC);
  LossScaler& s = *rig.scaler;
  EXPECT_EQ(s.scale(), 1024.0);
  std::vector<double> seen;
  for (bool finite : {true, true, false, true, false, false, false, false, false, true}) {
    s.after_check(finite);
    seen.push_back(s.scale());
  }
  EXPECT_EQ(seen, (std::vector<double>{1025, 1026, 256.5, 257.5, 64.375, 16.09375, 4.0234375,
                                       1.005859375, 1, 2}));
}

TEST(PrecisionChecks, HalfPrecisionBatchNormStatisticsAreRefusedUnlessKeptFp32) {
  try {
    Rig rig("[precision]\nname = \"o3\"\n");
    check_model_precision(*rig.model, rig.plan);
    FAIL() << "o3 with batch norm in bfloat16 was accepted";
  } catch (const PipelineError& e) {
    EXPECT_NE(std::string(e.what()).find("keep_norm_fp32 = true"), std::string::npos) << e.what();
  }
  Rig kept("[precision]\nname = \"o3\"\nkeep_norm_fp32 = true\n");
  EXPECT_NO_THROW(check_model_precision(*kept.model, kept.plan));
}

}  // namespace
