// Small helpers the model tests share: parameter counts and names, a training step.
#pragma once

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <sstream>
#include <string>

#include "kiln/torch.hpp"
#include "tensor_scratch.hpp"

namespace kiln_test {

inline int64_t parameter_count(const kiln::Model& model) {
  int64_t count = 0;
  for (const at::Tensor& p : model.parameters()) count += p.numel();
  return count;
}

inline std::set<std::string> parameter_names(const kiln::Model& model) {
  std::set<std::string> names;
  for (const auto& item : model.named_parameters()) names.insert(item.key());
  return names;
}

inline at::Tensor parameter(const kiln::Model& model, const std::string& name) {
  // The dict must outlive the pointer find() returns into it.
  const auto params = model.named_parameters();
  const at::Tensor* p = params.find(name);
  if (p == nullptr) throw std::runtime_error("no parameter " + name);
  return *p;
}

// Writes each of `model`'s parameters to `oracle` as <prefix><name>.bin and returns their shapes
// as the JSON object {"<name>": [d0, d1, ...], ...}, for a Python oracle to load them by name.
inline std::string write_parameters(const kiln::test::TensorScratch& oracle,
                                    const kiln::Model& model, const std::string& prefix = "") {
  std::ostringstream shapes;
  shapes << "{";
  bool first = true;
  for (const auto& item : model.named_parameters()) {
    oracle.write(prefix + item.key() + ".bin", item.value());
    shapes << (first ? "" : ", ") << "\"" << item.key() << "\": [";
    for (int64_t d = 0; d < item.value().dim(); ++d) {
      shapes << (d ? ", " : "") << item.value().size(d);
    }
    shapes << "]";
    first = false;
  }
  shapes << "}";
  return shapes.str();
}

// Forward on random images, cross-entropy, backward; expects the [N, classes] logits shape and
// a finite, nonzero gradient on every parameter.
inline void expect_trains(kiln::Model& model, int64_t batch, int64_t channels, int64_t height,
                          int64_t width, int64_t classes) {
  at::manual_seed(0);
  at::Tensor images = at::randn({batch, channels, height, width});
  at::Tensor labels = at::randint(classes, {batch}, at::kLong);
  at::Tensor logits = model.forward(images);
  ASSERT_EQ(logits.sizes(), at::IntArrayRef({batch, classes}));
  at::cross_entropy_loss(logits, labels).backward();
  for (const auto& item : model.named_parameters()) {
    const at::Tensor& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << item.key();
    EXPECT_TRUE(at::isfinite(grad).all().item<bool>()) << item.key();
    EXPECT_GT(grad.abs().sum().item<double>(), 0.0) << item.key();
  }
}

}  // namespace kiln_test
