// The loader's transforms and mixing against torchvision and timm's formulas on the same image
// and the same parameters (tests/oracle/transforms.py); the samplers by their statistics.
#include "data/transforms.hpp"

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "data/loader.hpp"
#include "data/mix.hpp"
#include "tensor_scratch.hpp"

namespace kd = kiln::data;

namespace {

constexpr int64_t kH = 97, kW = 131, kC = 3;

struct BoxCase {
  int64_t top, left, height, width, size;
};
struct EvalCase {
  int64_t resize, crop;
  bool transpose;
};
struct PadCase {
  int64_t pad, top, left;
  bool flip;
};

const std::vector<BoxCase> kBoxes = {
    {0, 0, kH, kW, 64},    // whole image, downscaled (antialiasing at work)
    {10, 20, 40, 50, 64},  // upscaled
    {5, 7, 90, 60, 32},    // strong downscale, odd box
    {3, 4, 32, 32, 32},    // same size: the crop itself
    {50, 80, 47, 51, 17},
};
const std::vector<EvalCase> kEval = {
    {64, 56, false}, {64, 56, true}, {80, 61, false}, {0, 45, false}, {49, 64, false}};
const std::vector<PadCase> kPads = {{4, 0, 0, false}, {4, 8, 3, true}, {2, 2, 2, true}};
const std::vector<double> kMean = {0.485, 0.456, 0.406}, kStd = {0.229, 0.224, 0.225};

std::string json_list(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

// The oracle run once for every test of this file.
class Oracle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new kiln::test::TensorScratch();
    at::manual_seed(11);
    image_ = at::randint(0, 256, {kH, kW, kC}, at::kByte);
    // Smooth regions too, where rounding differences would show.
    image_.slice(0, 0, 30).copy_(at::arange(kW, at::kFloat)
                                     .div(kW / 255.0)
                                     .to(at::kByte)
                                     .view({1, kW, 1})
                                     .expand({30, kW, kC}));
    scratch_->write("image.u8", image_);
    mix_x_ = at::randn({6, kC, kH, kW});
    mix_labels_ = at::tensor(std::vector<int64_t>{0, 3, 1, 4, 4, 2}, at::kLong);
    scratch_->write("mix_x.f32", mix_x_);
    scratch_->write("mix_labels.i64", mix_labels_);
    ce_logits_ = at::randn({6, 5});
    ce_probs_ = at::softmax(at::randn({6, 5}), 1);
    scratch_->write("ce_logits.f32", ce_logits_);
    scratch_->write("ce_probs.f32", ce_probs_);
    // The cutmix centre: the first two draws of the generator cutmix_box is given.
    std::mt19937_64 gen(99);
    cy_ = kd::randint(gen, 0, kH);
    cx_ = kd::randint(gen, 0, kW);

    std::string boxes, evals, pads;
    for (const auto& b : kBoxes) {
      boxes += (boxes.empty() ? "" : ", ") + fmt(b.top, b.left, b.height, b.width, b.size);
    }
    for (const auto& e : kEval) {
      evals += std::string(evals.empty() ? "" : ", ") + "[" + std::to_string(e.resize) + ", " +
               std::to_string(e.crop) + ", " + (e.transpose ? "true" : "false") + "]";
    }
    for (const auto& p : kPads) {
      pads += std::string(pads.empty() ? "" : ", ") + "[" + std::to_string(p.pad) + ", " +
              std::to_string(p.top) + ", " + std::to_string(p.left) + ", " +
              (p.flip ? "true" : "false") + "]";
    }
    scratch_->write_text(
        "config.json",
        "{\"height\": " + std::to_string(kH) + ", \"width\": " + std::to_string(kW) +
            ", \"channels\": " + std::to_string(kC) + ", \"boxes\": [" + boxes + "], \"eval\": [" +
            evals + "], \"pad_crops\": [" + pads + "], \"mean\": " + json_list(kMean) +
            ", \"std\": " + json_list(kStd) +
            ", \"rrc_draws\": 20000, \"rrc_scale\": [0.08, 1.0], \"rrc_ratio\": [0.75, "
            "1.3333333333333333], \"mix\": {\"batch\": 6, \"classes\": 5, \"lambda\": 0.3, "
            "\"cut_lambda\": 0.6, \"smoothing\": 0.1, \"cy\": " +
            std::to_string(cy_) + ", \"cx\": " + std::to_string(cx_) + "}}");
    scratch_->run("transforms.py");
  }
  static void TearDownTestSuite() {
    delete scratch_;
    scratch_ = nullptr;
    image_ = mix_x_ = mix_labels_ = ce_logits_ = ce_probs_ = at::Tensor();
  }

  static std::string fmt(int64_t a, int64_t b, int64_t c, int64_t d, int64_t e) {
    return "[" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + ", " +
           std::to_string(d) + ", " + std::to_string(e) + "]";
  }
  static at::Tensor read_hwc(const std::string& name, int64_t h, int64_t w) {
    return scratch_->read(name, {h, w, kC}, at::kByte);
  }
  static const uint8_t* pixels() { return image_.data_ptr<uint8_t>(); }
  // Max |a - b| in uint8 steps.
  static int64_t max_step(const at::Tensor& a, const at::Tensor& b) {
    return (a.to(at::kInt) - b.to(at::kInt)).abs().max().item<int64_t>();
  }

  static kiln::test::TensorScratch* scratch_;
  static at::Tensor image_, mix_x_, mix_labels_, ce_logits_, ce_probs_;
  static int64_t cy_, cx_;
};

kiln::test::TensorScratch* Oracle::scratch_ = nullptr;
at::Tensor Oracle::image_, Oracle::mix_x_, Oracle::mix_labels_, Oracle::ce_logits_,
    Oracle::ce_probs_;
int64_t Oracle::cy_ = 0, Oracle::cx_ = 0;

// An HWC result of 1 x C x H x W channels-last.
at::Tensor as_hwc(const at::Tensor& t) { return t[0].permute({1, 2, 0}).contiguous(); }

}  // namespace

// The same ATen kernel as torchvision v2's uint8 path: bit-equal. torchvision v1 resizes in
// float and rounds: within one uint8 step.
TEST_F(Oracle, ResizedCropIsTorchvisionsForTheSameBox) {
  const at::Tensor view = kd::hwc_view(pixels(), kH, kW, kC);
  for (size_t k = 0; k < kBoxes.size(); ++k) {
    const BoxCase& b = kBoxes[k];
    SCOPED_TRACE("box " + std::to_string(k));
    const at::Tensor ours =
        as_hwc(kd::resized_crop(view, {b.top, b.left, b.height, b.width}, b.size, b.size));
    EXPECT_EQ(max_step(ours, read_hwc("rrc_v2_" + std::to_string(k) + ".u8", b.size, b.size)), 0);
    EXPECT_LE(max_step(ours, read_hwc("rrc_v1_" + std::to_string(k) + ".u8", b.size, b.size)), 1);
  }
}

// Resize of the shorter side + CenterCrop through the loader (a one-image TensorSource):
// torchvision v2's pixels exactly, including CenterCrop's rounding and its zero padding where
// the crop is larger than the image.
TEST_F(Oracle, ResizeAndCenterCropAreTorchvisions) {
  for (size_t k = 0; k < kEval.size(); ++k) {
    const EvalCase& e = kEval[k];
    SCOPED_TRACE("eval case " + std::to_string(k));
    const at::Tensor img = e.transpose ? image_.transpose(0, 1).contiguous() : image_;
    kd::TensorSource source(img.unsqueeze(0), at::zeros({1}, at::kLong), 1,
                            kd::TensorSource::Layout::NHWC);
    kd::LoaderOptions o;
    o.batch_size = 1;
    o.workers = 0;
    o.shuffle = false;
    o.resize = e.resize;
    o.center_crop = e.crop;
    o.decode_scaled = false;
    kd::Loader loader(source, o);
    loader.start_epoch(0);
    const at::Tensor got = loader.next()->images[0].mul(255).round().to(at::kByte);
    const at::Tensor want = read_hwc("eval_" + std::to_string(k) + ".u8", e.crop, e.crop);
    EXPECT_EQ(max_step(got.permute({1, 2, 0}), want), 0);
  }
}

TEST_F(Oracle, PaddedCropAndFlipAreTorchvisions) {
  for (size_t k = 0; k < kPads.size(); ++k) {
    const PadCase& p = kPads[k];
    at::Tensor out = at::empty({kH, kW, kC}, at::kByte);
    kd::crop_hwc(pixels(), kH, kW, kC, {p.top - p.pad, p.left - p.pad, kH, kW}, p.flip,
                 out.data_ptr<uint8_t>());
    EXPECT_EQ(max_step(out, read_hwc("padcrop_" + std::to_string(k) + ".u8", kH, kW)), 0)
        << "case " << k;
  }
}

// ToTensor + Normalize per channel: float32 in the same order of operations.
TEST_F(Oracle, PerChannelNormalizeIsTorchvisions) {
  kd::TensorSource source(image_.unsqueeze(0), at::zeros({1}, at::kLong), 1,
                          kd::TensorSource::Layout::NHWC);
  kd::LoaderOptions o;
  o.batch_size = 1;
  o.workers = 0;
  o.mean = kMean;
  o.std = kStd;
  kd::Loader loader(source, o);
  loader.start_epoch(0);
  const at::Tensor got = loader.next()->images[0];
  const at::Tensor want = scratch_->read("normalized.f32", {kC, kH, kW});
  EXPECT_LE(kiln::test::closeness(got, want, 1e-6, 1e-6), 1.0);
}

// The sampler against torchvision's get_params over 20000 draws each (different generators):
// the means agree within five standard errors; the fallback crop is deterministic: equal.
TEST_F(Oracle, RandomResizedCropParamsMatchTorchvisionsDistribution) {
  std::mt19937_64 gen(5);
  const int n = 20000;
  std::vector<double> area, logr;
  for (int i = 0; i < n; ++i) {
    const kd::CropBox b =
        kd::random_resized_crop_params(kH, kW, {0.08, 1.0}, {3.0 / 4.0, 4.0 / 3.0}, gen);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, kH);
    ASSERT_LE(b.left + b.width, kW);
    area.push_back(double(b.height * b.width) / double(kH * kW));
    logr.push_back(std::log(double(b.width) / double(b.height)));
  }
  const auto stats = [](const std::vector<double>& v) {
    double m = 0, s = 0;
    for (double x : v) m += x;
    m /= double(v.size());
    for (double x : v) s += (x - m) * (x - m);
    return std::pair<double, double>{m, std::sqrt(s / double(v.size()))};
  };
  const auto [am, as] = stats(area);
  const auto [rm, rs] = stats(logr);
  const std::vector<double> theirs = scratch_->read_doubles("rrc_stats.f64", 4);
  const double se = std::sqrt(2.0 / n);  // standard error of a difference of two means, per sd
  EXPECT_NEAR(am, theirs[0], 5 * se * theirs[1]);
  EXPECT_NEAR(rm, theirs[2], 5 * se * theirs[3]);
  EXPECT_NEAR(as, theirs[1], 0.05 * theirs[1]);
  EXPECT_NEAR(rs, theirs[3], 0.05 * theirs[3]);

  const at::Tensor fb = scratch_->read("rrc_fallback.i64", {4}, at::kLong);
  const kd::CropBox ours = kd::random_resized_crop_params(kH, kW, {1.5, 2.0}, {0.75, 4.0 / 3}, gen);
  EXPECT_EQ(ours, (kd::CropBox{fb[0].item<int64_t>(), fb[1].item<int64_t>(), fb[2].item<int64_t>(),
                               fb[3].item<int64_t>()}));
  const at::Tensor ft = scratch_->read("rrc_fallback_tall.i64", {4}, at::kLong);
  const kd::CropBox tall = kd::random_resized_crop_params(kW, kH, {1.5, 2.0}, {0.75, 4.0 / 3}, gen);
  EXPECT_EQ(tall, (kd::CropBox{ft[0].item<int64_t>(), ft[1].item<int64_t>(), ft[2].item<int64_t>(),
                               ft[3].item<int64_t>()}));
}

// Mixup and CutMix given lambda (and cutmix's centre): timm's pixels and targets. Elementwise
// float32 in timm's order of operations: equal to float rounding (1e-6).
TEST_F(Oracle, MixupAndCutmixAreTimmsForTheSameDraw) {
  kd::MixParams mixup;
  mixup.lambda = 0.3;
  at::Tensor x = mix_x_.clone();
  kd::apply_mix(x, mixup);
  EXPECT_LE(kiln::test::closeness(x, scratch_->read("mixup_x.f32", mix_x_.sizes()), 1e-6, 1e-6),
            1.0);
  EXPECT_LE(kiln::test::closeness(kd::mix_targets(mix_labels_, 5, 0.3, 0.1),
                                  scratch_->read("mixup_t.f32", {6, 5}), 1e-6, 1e-7),
            1.0);

  std::mt19937_64 gen(99);
  const kd::MixParams cut = kd::cutmix_box(kH, kW, 0.6, gen);
  const std::vector<double> box = scratch_->read_doubles("cutmix_box.f64", 5);
  EXPECT_EQ(cut.y0, int64_t(box[0]));
  EXPECT_EQ(cut.y1, int64_t(box[1]));
  EXPECT_EQ(cut.x0, int64_t(box[2]));
  EXPECT_EQ(cut.x1, int64_t(box[3]));
  EXPECT_DOUBLE_EQ(cut.lambda, box[4]);
  at::Tensor xc = mix_x_.clone();
  kd::apply_mix(xc, cut);
  EXPECT_TRUE(at::equal(xc, scratch_->read("cutmix_x.f32", mix_x_.sizes())));
  EXPECT_LE(kiln::test::closeness(kd::mix_targets(mix_labels_, 5, cut.lambda, 0.1),
                                  scratch_->read("cutmix_t.f32", {6, 5}), 1e-6, 1e-7),
            1.0);
}

// The engine's loss with soft targets is F.cross_entropy(logits, probabilities).
TEST_F(Oracle, SoftTargetLossIsCrossEntropyWithProbabilities) {
  const double ours = at::cross_entropy_loss(ce_logits_, ce_probs_).item<double>();
  const double manual = -(ce_probs_ * at::log_softmax(ce_logits_, 1)).sum(1).mean().item<double>();
  const double theirs = scratch_->read_doubles("ce.f64", 1)[0];
  EXPECT_NEAR(ours, theirs, 1e-6 * std::abs(theirs));
  EXPECT_NEAR(manual, theirs, 1e-6 * std::abs(theirs));
}

// Beta(a, a) by its moments: mean 1/2, variance 1 / (4 (2a + 1)).
TEST(Mix, BetaSamplerHasTheRightMoments) {
  for (double a : {0.2, 0.8, 1.0, 2.5}) {
    std::mt19937_64 gen(17);
    const int n = 40000;
    double m = 0, m2 = 0;
    for (int i = 0; i < n; ++i) {
      const double x = kd::sample_beta(gen, a, a);
      ASSERT_GE(x, 0.0);
      ASSERT_LE(x, 1.0);
      m += x;
      m2 += x * x;
    }
    m /= n;
    const double var = m2 / n - m * m, want = 1.0 / (4.0 * (2.0 * a + 1.0));
    EXPECT_NEAR(m, 0.5, 5 * std::sqrt(want / n)) << "alpha " << a;
    EXPECT_NEAR(var, want, 0.03 * want) << "alpha " << a;
  }
}

// timm's _params_per_batch: prob gates mixing, switch_prob picks cutmix.
TEST(Mix, DrawFollowsProbAndSwitchProb) {
  kd::MixOptions o;
  o.mixup_alpha = 0.8;
  o.cutmix_alpha = 1.0;
  o.prob = 0.5;
  o.switch_prob = 0.25;
  std::mt19937_64 gen(3);
  int mixed = 0, cut = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const kd::MixParams p = kd::draw_mix(o, 32, 32, gen);
    if (p.lambda < 1.0) ++mixed;
    if (p.cutmix) ++cut;
  }
  EXPECT_NEAR(mixed / double(n), 0.5, 0.02);
  EXPECT_NEAR(cut / double(mixed), 0.25, 0.02);
  o.mixup_alpha = o.cutmix_alpha = 0.0;
  EXPECT_EQ(kd::draw_mix(o, 32, 32, gen).lambda, 1.0);
}

TEST(Transforms, ScaledDecodeDenominatorAndBox) {
  EXPECT_EQ(kd::decode_denominator(400, 500, 224, 224), 1);
  EXPECT_EQ(kd::decode_denominator(448, 500, 224, 224), 2);
  EXPECT_EQ(kd::decode_denominator(900, 1000, 224, 224), 4);
  EXPECT_EQ(kd::decode_denominator(1792, 1800, 224, 224), 8);
  EXPECT_EQ(kd::decode_denominator(4000, 1000, 224, 224), 4);  // both sides must allow it
  // The reduced box covers the full one: floor of the start, ceil of the end.
  EXPECT_EQ(kd::scale_box({5, 6, 100, 201}, 4, 250, 250), (kd::CropBox{1, 1, 26, 51}));
  EXPECT_EQ(kd::scale_box({5, 6, 100, 201}, 1, 250, 250), (kd::CropBox{5, 6, 100, 201}));
  // Clamped to a reduced image that rounds its sides up.
  EXPECT_EQ(kd::scale_box({0, 0, 99, 99}, 2, 50, 50), (kd::CropBox{0, 0, 50, 50}));
  EXPECT_EQ(kd::resize_shorter_size(480, 640, 256), (std::array<int64_t, 2>{256, 341}));
  EXPECT_EQ(kd::resize_shorter_size(640, 480, 256), (std::array<int64_t, 2>{341, 256}));
  EXPECT_EQ(kd::center_crop_box(256, 341, 224, 224), (kd::CropBox{16, 58, 224, 224}));
  EXPECT_EQ(kd::center_crop_box(5, 4, 2, 2), (kd::CropBox{2, 1, 2, 2}));  // round(1.5) = 2
  EXPECT_EQ(kd::center_crop_box(49, 66, 64, 64), (kd::CropBox{-7, 1, 64, 64}));
}
