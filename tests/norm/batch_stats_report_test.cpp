// What the norm plugins report to a host that updates the running statistics itself (ABI 1.5,
// kiln_norm_forward_args.batch_stats), through every code path that computes training
// statistics: the batch mean and unbiased variance of all values that shared them (torch's
// var_mean over each statistics group's concatenated inputs, in float64), their count and the
// plugin's momentum, with the output what the plugin gives without a report; and arguments from
// an older host, which has no batch_stats, still update the running statistics.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "norm_harness.hpp"

namespace kiln::norm_test {
namespace {

using test::Options;

constexpr double kMomentum = 0.25;

struct ReportCase {
  std::string name, library, component;
  std::vector<std::vector<int64_t>> shapes;  // one per rank
  at::ScalarType dtype;
  int32_t activation;
  double param;
  int64_t group_size;
};

void PrintTo(const ReportCase& c, std::ostream* os) { *os << c.name; }

class BatchStatsReport : public ::testing::TestWithParam<ReportCase> {};

TEST_P(BatchStatsReport, EqualsTheStatisticsOfEachGroupsSamples) {
  const ReportCase& c = GetParam();
  const int32_t world = static_cast<int32_t>(c.shapes.size());
  const int32_t k = c.group_size != 0 ? static_cast<int32_t>(c.group_size) : world;
  const int64_t channels = c.shapes[0][1];
  at::manual_seed(17);
  const at::Tensor w = at::rand({channels}) + 0.5, b = at::randn({channels});
  std::vector<at::Tensor> x;
  for (int32_t r = 0; r < world; ++r) {
    x.push_back((at::randn(c.shapes[r]) * 2.0 + 3.0 + r).to(c.dtype));
  }
  std::vector<std::unique_ptr<Layer>> reporting, plain;
  std::vector<State> reporting_state, plain_state;
  for (int32_t r = 0; r < world; ++r) {
    for (auto* layers : {&reporting, &plain}) {
      layers->push_back(std::make_unique<Layer>());
      Options options;
      options.set_float("momentum", kMomentum);
      if (c.group_size != 0) options.set_int("group_size", c.group_size);
      ASSERT_EQ(
          create(*layers->back(), c.library, c.component, options, channels, c.activation, c.param),
          "");
    }
    reporting_state.push_back(make_state(channels, w, b, at::kCPU));
    plain_state.push_back(make_state(channels, w, b, at::kCPU));
  }
  std::vector<Report> reports(world);
  std::vector<at::Tensor> y(world), y_plain(world);
  ThreadGroup group(world);
  run_ranks(group, [&](int32_t r, kiln_call_context* ctx) {
    y[r] = at::empty_like(x[r]);
    y_plain[r] = at::empty_like(x[r]);
    ASSERT_EQ(forward_reporting(*reporting[r], ctx, x[r], y[r], reporting_state[r], reports[r]),
              "");
    ASSERT_EQ(forward(*plain[r], ctx, true, x[r], y_plain[r], plain_state[r]), "");
  });
  // float32 statistics against float64 ones of the same values.
  const double tol = 1e-5;
  for (int32_t r = 0; r < world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    std::vector<at::Tensor> members(x.begin() + (r / k) * k, x.begin() + (r / k + 1) * k);
    const at::Tensor all = at::cat(members).to(at::kDouble);
    std::vector<int64_t> dims = {0};
    for (int64_t d = 2; d < all.dim(); ++d) dims.push_back(d);
    const auto [var, mean] = at::var_mean(all, dims, /*unbiased=*/true);
    const Report& got = reports[r];
    EXPECT_EQ(got.reported, 1);
    EXPECT_EQ(got.count, static_cast<double>(all.numel() / channels));
    EXPECT_EQ(got.momentum, kMomentum);
    expect_close(got.mean, mean, tol, tol, "mean");
    expect_close(got.var, var, tol, tol, "unbiased variance");
    EXPECT_TRUE(at::equal(y[r], y_plain[r])) << "the report changed the output";
    EXPECT_TRUE(at::equal(reporting_state[r].save_mean, plain_state[r].save_mean));
    EXPECT_TRUE(at::equal(reporting_state[r].save_invstd, plain_state[r].save_invstd));
    // The plain forward updated its running statistics from the same batch.
    expect_close(plain_state[r].running_mean, mean * kMomentum, tol, tol, "plain running_mean");
  }
}

std::vector<ReportCase> report_cases() {
  return {
      // ATen's out kernel (float32) and the general kernel (bfloat16 input).
      {"batchnorm_f32",
       "kiln_batchnorm",
       "batchnorm",
       {{6, 3, 4, 4}},
       at::kFloat,
       KILN_ACT_NONE,
       0.0,
       0},
      {"batchnorm_bf16",
       "kiln_batchnorm",
       "batchnorm",
       {{6, 3, 4, 4}},
       at::kBFloat16,
       KILN_ACT_NONE,
       0.0,
       0},
      // inplace_abn's fused float32 path and its chunked path (bfloat16).
      {"inplace_abn_f32",
       "kiln_inplace_abn",
       "inplace_abn",
       {{5, 3, 2, 3}},
       at::kFloat,
       KILN_ACT_LEAKY_RELU,
       0.01,
       0},
      {"inplace_abn_bf16",
       "kiln_inplace_abn",
       "inplace_abn",
       {{5, 3, 2, 3}},
       at::kBFloat16,
       KILN_ACT_LEAKY_RELU,
       0.01,
       0},
      // Shared statistics: uneven ranks, the sync ABN, subgroups.
      {"syncbn_3_5",
       "kiln_syncbn",
       "syncbn",
       {{3, 3, 4, 4}, {5, 3, 4, 4}},
       at::kFloat,
       KILN_ACT_NONE,
       0.0,
       0},
      {"inplace_abn_sync_2x4",
       "kiln_inplace_abn",
       "inplace_abn_sync",
       {{4, 2, 3}, {4, 2, 3}},
       at::kFloat,
       KILN_ACT_ELU,
       1.0,
       0},
      {"syncbn_groups_of_2_on_4",
       "kiln_syncbn",
       "syncbn",
       {{2, 3, 3}, {3, 3, 3}, {1, 3, 3}, {4, 3, 3}},
       at::kFloat,
       KILN_ACT_NONE,
       0.0,
       2},
  };
}

INSTANTIATE_TEST_SUITE_P(Paths, BatchStatsReport, ::testing::ValuesIn(report_cases()),
                         [](const auto& info) { return info.param.name; });

// Arguments of a 1.4 host have no batch_stats: the plugins update the running statistics as
// before and leave the report alone, whatever lies past the struct_size.
TEST(BatchStatsReport, AnOlderHostsArgumentsUpdateAsBefore) {
  struct Plugin {
    const char* library;
    const char* component;
    int32_t activation;
  };
  for (const Plugin& p : {Plugin{"kiln_batchnorm", "batchnorm", KILN_ACT_NONE},
                          Plugin{"kiln_syncbn", "syncbn", KILN_ACT_NONE},
                          Plugin{"kiln_inplace_abn", "inplace_abn", KILN_ACT_LEAKY_RELU}}) {
    SCOPED_TRACE(p.component);
    Layer layer;
    Options options;
    options.set_float("momentum", kMomentum);
    ASSERT_EQ(create(layer, p.library, p.component, options, 3, p.activation, 0.01), "");
    State state = make_state(3, at::ones({3}), at::zeros({3}), at::kCPU);
    const at::Tensor x = at::randn({6, 3, 2, 2}) + 2.0;
    at::Tensor y = at::empty_like(x);
    Report report;
    ThreadGroup group(1);
    run_ranks(group, [&](int32_t, kiln_call_context* ctx) {
      ASSERT_EQ(
          forward_reporting(layer, ctx, x, y, state, report, KILN_NORM_FORWARD_ARGS_V1_4_SIZE), "");
    });
    EXPECT_EQ(report.reported, 0);
    EXPECT_TRUE(at::equal(report.mean, at::full({3}, -7.0f)));
    const at::Tensor mean = x.to(at::kDouble).mean({0, 2, 3});
    expect_close(state.running_mean, mean * kMomentum, 1e-5, 1e-5, "running_mean");
  }
}

}  // namespace
}  // namespace kiln::norm_test
