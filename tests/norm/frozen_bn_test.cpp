// frozen_bn against FrozenBatchNorm2d as torchvision writes it (tests/oracle/frozen_bn.py):
// forward and input gradient in training and eval, statistics untouched, no saved tensor.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "norm_harness.hpp"
#include "tensor_scratch.hpp"

namespace kiln::norm_test {
namespace {

using test::Options;
using test::TensorScratch;

constexpr const char* kLib = "kiln_frozen_bn";

class FrozenBnVsTorch : public ::testing::TestWithParam<std::vector<int64_t>> {};

TEST_P(FrozenBnVsTorch, EqualsFrozenBatchNorm2d) {
  const std::vector<int64_t> shape = GetParam();
  const int64_t channels = shape[1];
  const double eps = 1e-3;
  // Tolerance 1e-5 relative + 1e-6 absolute: one multiply-add per element in float32 in both.
  const double rtol = 1e-5, atol = 1e-6;
  at::manual_seed(5);
  TensorScratch oracle;
  const at::Tensor w = at::randn({channels}), b = at::randn({channels});
  const at::Tensor rm = at::randn({channels}), rv = at::rand({channels}) + 0.1;
  const at::Tensor x = at::randn(shape) * 2 + 1, gy = at::randn(shape);
  oracle.write("weight.bin", w);
  oracle.write("bias.bin", b);
  oracle.write("running_mean.bin", rm);
  oracle.write("running_var.bin", rv);
  oracle.write("x.bin", x);
  oracle.write("gy.bin", gy);
  std::ostringstream config;
  config << "{\"shape\": [";
  for (size_t d = 0; d < shape.size(); ++d) config << (d ? ", " : "") << shape[d];
  config << "], \"eps\": " << eps << "}";
  oracle.write_text("config.json", config.str());
  oracle.run("frozen_bn.py");

  Layer layer;
  Options options;
  options.set_float("eps", eps);
  ASSERT_EQ(create(layer, kLib, "frozen_bn", options, channels), "");
  EXPECT_EQ(layer.layout.affine, 1);
  EXPECT_EQ(layer.layout.running_stats, 1);
  EXPECT_EQ(layer.layout.frozen, 1);
  EXPECT_EQ(layer.layout.saves, KILN_NORM_SAVE_NOTHING);
  EXPECT_EQ(layer.layout.in_place, 0);
  EXPECT_EQ(layer.layout.fused_activation, 0);

  State state = make_state(channels, w, b, at::kCPU);
  state.running_mean.copy_(rm);
  state.running_var.copy_(rv);
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "eval");
    at::Tensor y = at::empty_like(x);
    ASSERT_EQ(forward(layer, nullptr, training, x, y, state), "");
    expect_close(y, oracle.read("y.bin", shape), rtol, atol, "output");
    // Training changes nothing the layer holds.
    EXPECT_TRUE(at::equal(state.running_mean, rm));
    EXPECT_TRUE(at::equal(state.running_var, rv));
    EXPECT_TRUE(at::equal(state.weight, w));
    EXPECT_TRUE(at::equal(state.bias, b));
    Grads grads;
    // No saved tensor, no parameter gradients (frozen), as the host calls it.
    ASSERT_EQ(backward(layer, nullptr, training, gy, at::Tensor(), state, grads, /*frozen=*/true),
              "");
    expect_close(grads.input, oracle.read("gx.bin", shape), rtol, atol, "grad_input");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FrozenBnVsTorch,
                         ::testing::Values(std::vector<int64_t>{4, 3, 5, 6},
                                           std::vector<int64_t>{8, 5},
                                           std::vector<int64_t>{2, 2, 3, 4, 2}));

// bf16 / f16 inputs with float32 buffers agree with the float32 run to 2e-2 (half rounding).
TEST(FrozenBn, HalfInputsMatchFloat) {
  Layer layer;
  Options options;
  ASSERT_EQ(create(layer, kLib, "frozen_bn", options, 3), "");
  at::manual_seed(9);
  State state = make_state(3, at::randn({3}), at::randn({3}), at::kCPU);
  state.running_mean.copy_(at::randn({3}));
  state.running_var.copy_(at::rand({3}) + 0.5);
  const at::Tensor x = at::randn({4, 3, 5, 5}), gy = at::randn(x.sizes());
  at::Tensor ref = at::empty_like(x);
  Grads ref_g;
  ASSERT_EQ(forward(layer, nullptr, true, x, ref, state), "");
  ASSERT_EQ(backward(layer, nullptr, true, gy, at::Tensor(), state, ref_g, true), "");
  for (at::ScalarType type : {at::kHalf, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(type));
    at::Tensor in = x.to(type), out = at::empty_like(in);
    Grads g;
    ASSERT_EQ(forward(layer, nullptr, true, in, out, state), "");
    ASSERT_EQ(backward(layer, nullptr, true, gy.to(type), at::Tensor(), state, g, true), "");
    expect_close(out, ref, 2e-2, 2e-2, "output");
    expect_close(g.input, ref_g.input, 2e-2, 2e-2, "grad_input");
  }
}

TEST(FrozenBn, RefusesNonPositiveEps) {
  Layer layer;
  Options options;
  options.set_float("eps", 0.0);
  const std::string status = create(layer, kLib, "frozen_bn", options, 3);
  EXPECT_NE(status.find("frozen_bn: eps must be > 0"), std::string::npos) << status;
}

}  // namespace
}  // namespace kiln::norm_test
