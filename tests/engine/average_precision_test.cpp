// Mean average precision (engine/average_precision.hpp) on rankings worked by hand, as sklearn's
// average_precision_score and torchmetrics' multilabel_average_precision (macro) compute them:
// tied scores are one threshold, a class without a positive sample is left out of the mean.
#include "engine/average_precision.hpp"

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cmath>

namespace {

using kiln::engine::mean_average_precision;

at::Tensor matrix(std::initializer_list<std::initializer_list<float>> rows) {
  std::vector<float> flat;
  int64_t n = 0, c = 0;
  for (const auto& row : rows) {
    flat.insert(flat.end(), row.begin(), row.end());
    c = static_cast<int64_t>(row.size());
    ++n;
  }
  return at::tensor(flat, at::kFloat).view({n, c});
}

TEST(MeanAveragePrecision, TiesAreOneThresholdAndClassesWithoutPositivesAreLeftOut) {
  // Class 0: scores 0.9 (positive), 0.8 and 0.8 (one positive), 0.1: the first threshold has
  // recall 1/2 at precision 1, the tied pair adds recall 1/2 at precision 2/3: AP = 5/6.
  // Class 1: no positive sample: left out. Class 2: ranked perfectly: AP = 1.
  const at::Tensor scores =
      matrix({{0.9F, 0.3F, 0.7F}, {0.8F, 0.2F, 0.1F}, {0.8F, 0.5F, 0.6F}, {0.1F, 0.4F, 0.0F}});
  const at::Tensor targets = matrix({{1, 0, 1}, {0, 0, 0}, {1, 0, 1}, {0, 0, 0}});
  EXPECT_NEAR(mean_average_precision(scores, targets), (5.0 / 6.0 + 1.0) / 2.0, 1e-12);
  // The ranking alone counts: any monotone map of the scores gives the same value.
  EXPECT_NEAR(mean_average_precision(scores * 10.0 - 3.0, targets), (5.0 / 6.0 + 1.0) / 2.0, 1e-12);
}

TEST(MeanAveragePrecision, APerfectRankingIsExactlyOne) {
  const at::Tensor scores = at::linspace(1.0, 0.0, 7, at::kFloat).view({7, 1});
  const at::Tensor targets = matrix({{1}, {1}, {1}, {0}, {0}, {0}, {0}});
  EXPECT_EQ(mean_average_precision(scores, targets), 1.0);
}

TEST(MeanAveragePrecision, SoftTargetsArePositiveFromOneHalf) {
  const at::Tensor scores = matrix({{0.2F}, {0.9F}, {0.5F}});
  // Positives: samples 1 (0.5) and 2 (0.8), ranked first and second: AP = 1.
  EXPECT_NEAR(mean_average_precision(scores, matrix({{0.49F}, {0.5F}, {0.8F}})), 1.0, 1e-12);
  // The worst ranking: positive last, AP = precision 1/3 at full recall.
  EXPECT_NEAR(mean_average_precision(scores, matrix({{1.0F}, {0.0F}, {0.0F}})), 1.0 / 3.0, 1e-12);
}

TEST(MeanAveragePrecision, NanWhenNoClassHasAPositiveOrAScoreIsNan) {
  EXPECT_TRUE(std::isnan(mean_average_precision(matrix({{0.1F, 0.2F}}), matrix({{0, 0}}))));
  EXPECT_TRUE(
      std::isnan(mean_average_precision(matrix({{NAN}, {0.2F}}), matrix({{1.0F}, {0.0F}}))));
}

}  // namespace
